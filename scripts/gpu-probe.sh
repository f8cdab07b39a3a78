#!/usr/bin/env bash
# Records what a GPU node's NVIDIA tools report (the raw formats the portal's GPU readings are built on):
# nvidia-smi's XML and CSV queries idle and under load, dmon samples, device files, topology, and whether
# NVML's Python bindings and DCGM are there. Run on a node with NVIDIA GPUs: bash scripts/gpu-probe.sh OUTDIR
set -uo pipefail
out=${1:?usage: gpu-probe.sh OUTDIR}
mkdir -p "$out"
q=index,uuid,name,pci.bus_id,driver_version,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,mig.mode.current
{
    echo "## uname"; uname -a
    echo "## device files"; ls -l /dev/nvidia* 2>&1
    echo "## nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "## topology"; nvidia-smi topo -m 2>&1
    echo "## tools"; for t in nvidia-smi dcgmi nv-hostengine dcgm-exporter nvidia-persistenced; do printf '%s: %s\n' "$t" "$(command -v "$t" || echo absent)"; done
    echo "## python NVML"; python3 -c 'import pynvml; pynvml.nvmlInit(); print("pynvml", pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetCount())' 2>&1
} >"$out/inventory.txt"
nvidia-smi -q -x >"$out/nvidia-smi-q-idle.xml" 2>&1
nvidia-smi --query-gpu=$q --format=csv >"$out/query-gpu-idle.csv" 2>&1
# Load the GPU for a while (matrix products) and read the same figures while it is busy.
python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 25
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
PY
load=$!
sleep 8
nvidia-smi --query-gpu=$q --format=csv >"$out/query-gpu-busy.csv" 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,process_name,used_memory --format=csv >"$out/query-compute-apps-busy.csv" 2>&1
nvidia-smi dmon -c 5 -s pucm >"$out/dmon-busy.txt" 2>&1
nvidia-smi -q -x >"$out/nvidia-smi-q-busy.xml" 2>&1
wait "$load"
nvidia-smi --query-gpu=$q --format=csv >"$out/query-gpu-after.csv" 2>&1
ls -l "$out"
