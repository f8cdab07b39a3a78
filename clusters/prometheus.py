"""Reading NVIDIA DCGM exporter series from a cluster's Prometheus: one instant query per metric, for all its GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

# The DCGM exporter's own names (NVIDIA dcgm-exporter, default counters): utilisation in percent, framebuffer
# memory used in MiB; each series is labelled with the GPU's index on its host (`gpu`), `UUID`, `device`
# (nvidia0), `modelName`, `pci_bus_id` and `Hostname`.
GPU_UTILISATION_METRIC = "DCGM_FI_DEV_GPU_UTIL"
GPU_MEMORY_METRIC = "DCGM_FI_DEV_FB_USED"
QUERY_TIMEOUT_SECONDS = 10


class PrometheusError(Exception):
    """Prometheus did not answer, or answered with an error: this cycle has no readings (retried next cycle)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU over the last window: its mean utilisation (percent) and its most memory used (MiB)."""

    utilisation_percent: float
    memory_mib: int
    uuid: str


GpuKey = tuple[str, int]  # (host, GPU index)


def gpu_readings(*, url: str, window_seconds: int, client: httpx.Client | None = None) -> dict[GpuKey, GpuReading]:
    """Every GPU Prometheus has DCGM series for, keyed by (Hostname, gpu): two queries, whatever the number of
    GPUs or jobs. Averaged over the window (the collection interval), so a reading between two collections
    stands for the whole interval, not for one scrape of it."""
    window = f"{max(window_seconds, 1)}s"
    own = client is None
    http = client or httpx.Client(timeout=QUERY_TIMEOUT_SECONDS)
    try:
        utilisation = _vector(http, url, f"avg_over_time({GPU_UTILISATION_METRIC}[{window}])")
        memory = _vector(http, url, f"max_over_time({GPU_MEMORY_METRIC}[{window}])")
    finally:
        if own:
            http.close()
    readings: dict[GpuKey, GpuReading] = {}
    for key, (value, uuid) in utilisation.items():
        memory_value = memory.get(key, (0.0, uuid))[0]
        readings[key] = GpuReading(utilisation_percent=value, memory_mib=int(memory_value), uuid=uuid)
    return readings


def _vector(client: httpx.Client, url: str, query: str) -> dict[GpuKey, tuple[float, str]]:
    try:
        response = client.get(f"{url.rstrip('/')}/api/v1/query", params={"query": query})
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise PrometheusError(f"{url}: {exc}") from exc
    if response.status_code != 200 or body.get("status") != "success":
        raise PrometheusError(f"{url}: HTTP {response.status_code} {body.get('error', '')}".strip())
    found: dict[GpuKey, tuple[float, str]] = {}
    for series in body.get("data", {}).get("result", []):
        labels = series.get("metric", {})
        host, index = labels.get("Hostname", ""), labels.get("gpu", "")
        if not host or not index.isdigit():
            continue
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if value == value:  # NaN: no sample in the window
            found[(host, int(index))] = (value, labels.get("UUID", ""))
    return found
