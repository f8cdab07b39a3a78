#!/usr/bin/env bash
# Records real GPU utilisation traces of three job shapes that GPU-efficiency reports must tell apart, sampled
# through NVML (the library DCGM and Slurm's gres/gpuutil read too) every 0.5 s:
#   busy     - matrix products back to back (a training step loop that keeps the GPU fed)
#   idle     - memory held, nothing computed (a notebook left open after its last cell)
#   starving - a short burst of compute, then the CPU "loads data" for four times as long (a data loader that
#              cannot keep up)
# Writes OUTDIR/trace-<shape>.csv (seconds since start, GPU utilisation %, memory-controller utilisation %,
# framebuffer used MiB, power W, SM clock MHz) and OUTDIR/inventory.txt. Run on a node with an NVIDIA GPU and
# PyTorch: bash scripts/gpu-trace.sh OUTDIR [SECONDS_PER_SHAPE]
set -euo pipefail
out=${1:?usage: gpu-trace.sh OUTDIR [SECONDS_PER_SHAPE]}
seconds=${2:-40}
mkdir -p "$out"
{
    echo "## nvidia-smi -L"; nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current --format=csv 2>&1
    echo "## tools"; for t in dcgmi nv-hostengine dcgm-exporter; do printf '%s: %s\n' "$t" "$(command -v "$t" || echo absent)"; done
    python3 -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} >"$out/inventory.txt"
python3 - "$out" "$seconds" <<'PY'
import csv
import sys
import threading
import time

import pynvml
import torch

out, seconds = sys.argv[1], float(sys.argv[2])
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)


def sample(path: str, stop: threading.Event) -> None:
    started = time.monotonic()
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["seconds", "gpu_util_percent", "mem_util_percent", "fb_used_mib", "power_w", "sm_clock_mhz"])
        while not stop.is_set():
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
            clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            writer.writerow([f"{time.monotonic() - started:.1f}", rates.gpu, rates.memory, memory.used // 2**20,
                             f"{power:.0f}", clock])
            time.sleep(0.5)


def run(shape: str, work) -> None:
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(f"{out}/trace-{shape}.csv", stop))
    sampler.start()
    work(time.monotonic() + seconds)
    stop.set()
    sampler.join()
    torch.cuda.empty_cache()
    time.sleep(3)  # the GPU settles between shapes


a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)


def busy(until: float) -> None:
    while time.monotonic() < until:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def idle(until: float) -> None:
    held = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")  # 20 GiB held, nothing computed
    while time.monotonic() < until:
        time.sleep(0.5)
    del held


def starving(until: float) -> None:
    while time.monotonic() < until:
        burst = time.monotonic() + 0.2
        while time.monotonic() < burst:
            a @ a
            torch.cuda.synchronize()
        time.sleep(0.8)  # the data loader


for shape, work in (("busy", busy), ("idle", idle), ("starving", starving)):
    run(shape, work)
    print(shape, "done", flush=True)
PY
ls -l "$out"
