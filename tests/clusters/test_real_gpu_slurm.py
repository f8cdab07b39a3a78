"""What Slurm 26.05 answered about a job on a real NVIDIA H200 with NVML autodetection (recorded by
scripts/gpu-slurm-check.sh on a lent machine, tests/data/nvidia-h200/slurm-26.05-nvml/): the codecs read the
GPU usage Slurm's accounting recorded (gres/gpuutil, gres/gpumem), the device index the job held and the node's
GPUs from real replies, not from replies with entries added by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusters.slurm.codecs import codec_for
from clusters.slurm.types import JobState, NodeState

RECORDED = Path(__file__).resolve().parents[1] / "data" / "nvidia-h200" / "slurm-26.05-nvml"
# A second job: 15 s of matrix products, then 20 s holding its GPU memory and computing nothing.
BUSY_THEN_IDLE = RECORDED.parent / "slurm-26.05-nvml-busy-then-idle"
API_VERSION = "0.0.45"


def _reply(name: str, directory: Path = RECORDED) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads((directory / name).read_text())
    return reply


def test_accounting_of_a_job_on_a_real_gpu_carries_slurms_gpu_usage() -> None:
    # The batch step's TRES usage as slurmdbd stored it: gres/gpuutil 100 (%), gres/gpumem 5,211,422,720 bytes
    # (4,970 MiB: the 4 GiB the job held plus CUDA's context; nvidia-smi read 4,979 MiB).
    (record,) = codec_for(API_VERSION).decode_accounting_jobs(_reply("slurmdb-job.json"))

    assert (record.job_id, record.state, record.gpus_allocated) == (1, JobState.COMPLETED, 1)
    assert record.gpu_utilisation_percent == 100.0
    assert record.gpu_memory_peak_bytes == 5_211_422_720


def test_a_running_job_holds_the_gpu_nvml_found_at_index_0() -> None:
    (job,) = codec_for(API_VERSION).decode_jobs(_reply("job.json")).jobs

    assert job.state == JobState.RUNNING
    assert job.gpu_indices == (("gpunode", (0,)),)


def test_the_node_reports_the_autodetected_gpu_in_use() -> None:
    # slurm.conf said Gres=gpu:1 without a type: NVML named the device nvidia_h200, which matches no configured
    # type, so Slurm kept the GPU untyped (slurmd.log: "Setting system GRES type to NULL").
    (node,) = codec_for(API_VERSION).decode_nodes(_reply("nodes.json"))

    assert (node.name, node.state, node.gpu_type, node.gpus_total, node.gpus_used) == (
        "gpunode",
        NodeState.MIXED,
        None,
        1,
        1,
    )
    assert "Setting system GRES type to NULL" in (RECORDED / "slurmd.log").read_text()


def test_accounting_keeps_a_steps_peak_utilisation_not_its_mean() -> None:
    # While the job ran, sstat's average fell from 92 to 18 % once it stopped computing (nvidia-smi: 0 %); when it
    # ended, slurmdbd stored its highest reading, 95, as the step's average, minimum, maximum and total. The
    # portal's accounting fallback (jobs/gpu_utilisation.py) therefore sees 95 % for a job idle most of its life.
    body = _reply("slurmdb-job.json", BUSY_THEN_IDLE)
    (step,) = body["jobs"][0]["steps"]
    usage = step["tres"]["requested"]
    readings = {
        kind: next(entry["count"] for entry in usage[kind] if entry["name"] == "gpuutil")
        for kind in ("average", "min", "max", "total")
    }
    assert readings == {"average": 95, "min": 95, "max": 95, "total": 95}
    report = (BUSY_THEN_IDLE / "report.txt").read_text()
    assert "gres/gpuutil=18," in report  # the last sstat sample, 26 s in

    (record,) = codec_for(API_VERSION).decode_accounting_jobs(body)
    assert record.gpu_utilisation_percent == 95.0
