#!/usr/bin/env python3
"""A stand-in for NVIDIA's DCGM exporter on the local clusters' fake-GPU nodes: serves `DCGM_FI_DEV_GPU_UTIL` and
`DCGM_FI_DEV_FB_USED` with the exporter's own labels (gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION), replaying traces recorded through NVML on a real H100 (tests/data/nvidia-h100/).

The readings are real; which node and GPU replays which trace is made up (README, "Fake GPUs"). By default GPU i
of every node replays busy, starving, idle, busy, ... in turn; `--assign gpu01:2=idle` pins one, and
`--assign gpu01:0=busy@20>idle` replays busy for the first 20 s, then idle (a job that stops working).

    dcgm_replay.py --listen 127.0.0.1:9400 --node gpu01:4:h100 --node gpu02:4:h100
    dcgm_replay.py --listen 127.0.0.1:9400 --clusters-dir /var/lib/gpuportal/clusters   # the demo's clusters

Each reading is the mean of the trace's samples (taken every 0.5 s) over the last `--window` seconds, as NVML's
own utilisation is a mean over its sample period: a scrape every second then sees what the GPU did in that second,
not one 0.5 s sample of it. The traces loop.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

TRACE_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "nvidia-h100"
TRACE_CYCLE = ("busy", "starving", "idle")
DRIVER_VERSION = "580.159.04"  # the driver the traces were recorded with (tests/data/nvidia-h100/inventory.txt)
# What NVML calls each GPU type the clusters fake; every one replays the H100's readings.
MODEL_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "a100": "NVIDIA A100-SXM4-80GB",
    "l40s": "NVIDIA L40S",
}
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


@dataclass(frozen=True)
class Sample:
    seconds: float
    utilisation_percent: float
    memory_mib: float


def load_trace(name: str, directory: Path = TRACE_DIR) -> list[Sample]:
    with (directory / f"trace-{name}.csv").open() as handle:
        return [
            Sample(float(row["seconds"]), float(row["gpu_util_percent"]), float(row["fb_used_mib"]))
            for row in csv.DictReader(handle)
        ]


@dataclass(frozen=True)
class Gpu:
    host: str
    index: int
    model: str
    trace: str

    @property
    def uuid(self) -> str:
        # Stable per host and index, shaped as NVML's: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.host}.gpu{self.index}.dcgm-replay')}"

    @property
    def labels(self) -> list[str]:
        bus = f"00000000:{0x18 + self.index * 0x10:02X}:00.0"
        return [str(self.index), self.uuid, bus, f"nvidia{self.index}", self.model, self.host, DRIVER_VERSION]


def reading(trace: list[Sample], *, elapsed: float, window: float) -> tuple[float, float]:
    """Mean utilisation and most memory over the trace's samples in (elapsed - window, elapsed], looping."""
    period = trace[-1].seconds + (trace[-1].seconds - trace[-2].seconds)
    end = elapsed % period
    chosen = [s for s in trace if end - window < s.seconds <= end or end - window < s.seconds - period <= end]
    if not chosen:  # a window shorter than the sample step: the latest sample
        chosen = [max((s for s in trace if s.seconds <= end), key=lambda s: s.seconds, default=trace[-1])]
    return sum(s.utilisation_percent for s in chosen) / len(chosen), max(s.memory_mib for s in chosen)


def trace_at(spec: str, elapsed: float) -> str:
    """The trace a GPU replays now: "idle", or "busy@20>idle" (busy for 20 s, then idle)."""
    first, _, then = spec.partition(">")
    if not then:
        return first
    name, _, seconds = first.partition("@")
    return name if elapsed < float(seconds) else then


def trace_names(spec: str) -> set[str]:
    first, _, then = spec.partition(">")
    return {first.partition("@")[0], *filter(None, [then])}


class ReplayCollector(Collector):
    def __init__(self, gpus: list[Gpu], traces: dict[str, list[Sample]], window: float) -> None:
        self.gpus, self.traces, self.window = gpus, traces, window
        self.started = time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        utilisation = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=LABELS)
        memory = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=LABELS)
        elapsed = time.monotonic() - self.started
        for gpu in self.gpus:
            trace = trace_at(gpu.trace, elapsed)
            percent, mib = reading(self.traces[trace], elapsed=elapsed, window=self.window)
            utilisation.add_metric(gpu.labels, round(percent))
            memory.add_metric(gpu.labels, round(mib))
        yield utilisation
        yield memory


def gpus_of(nodes: Iterable[tuple[str, int, str]], assigned: dict[tuple[str, int], str]) -> list[Gpu]:
    gpus = []
    for host, count, gpu_type in nodes:
        model = MODEL_NAMES.get(gpu_type, f"NVIDIA {gpu_type.upper()}")
        for index in range(count):
            trace = assigned.get((host, index), TRACE_CYCLE[index % len(TRACE_CYCLE)])
            gpus.append(Gpu(host=host, index=index, model=model, trace=trace))
    return gpus


def nodes_from_clusters(directory: Path, gpus_per_node: int | None = None) -> list[tuple[str, int, str]]:
    """The nodes of the local clusters that are up, from what scripts/cluster.sh wrote. The description names one
    GPU type and count per cluster; `gpus_per_node` serves more where some nodes have more (series of GPUs a node
    lacks match no job)."""
    nodes = []
    for path in sorted(directory.glob("*.json")):
        described = json.loads(path.read_text())
        if described.get("status") != "up":
            continue
        count = max(int(described.get("gpus_per_node", 4)), gpus_per_node or 0)
        for name in described.get("nodes", []):
            nodes.append((name, count, described.get("gpu_type", "h100")))
    return nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:9400", help="host:port (port 0: any free one, printed)")
    parser.add_argument("--node", action="append", default=[], help="NAME:GPUS:TYPE, e.g. gpu01:4:h100")
    parser.add_argument("--clusters-dir", type=Path, help="replay every node of the clusters described there")
    parser.add_argument("--gpus-per-node", type=int, help="with --clusters-dir: at least this many GPUs per node")
    parser.add_argument("--assign", action="append", default=[], help="NODE:INDEX=busy|idle|starving")
    parser.add_argument("--window", type=float, default=1.0, help="seconds each reading averages (default 1)")
    args = parser.parse_args(argv)

    nodes = [(name, int(count), gpu_type) for name, count, gpu_type in (n.split(":") for n in args.node)]
    if args.clusters_dir:
        nodes += nodes_from_clusters(args.clusters_dir, args.gpus_per_node)
    assigned = {}
    for item in args.assign:
        where, _, trace = item.partition("=")
        host, _, index = where.rpartition(":")
        assigned[(host, int(index))] = trace
    gpus = gpus_of(nodes, assigned)
    names = set(TRACE_CYCLE).union(*(trace_names(gpu.trace) for gpu in gpus))
    traces = {name: load_trace(name) for name in names}
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ReplayCollector(gpus, traces, args.window))
    host, _, port = args.listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    print(
        f"dcgm_replay: {len(gpus)} GPUs on {len(nodes)} nodes at http://{host}:{server.server_port}/metrics", flush=True
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
