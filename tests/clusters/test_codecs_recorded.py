"""The data_parser codecs (v0.0.40-v0.0.45) against recorded slurmrestd replies and the OpenAPI specs."""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

# The project sits at <x>/main and the shared material at <x>/shared.
_DEFAULT_SHARED_DIR = Path(__file__).resolve().parents[2].parent / "shared"
SHARED_DIR = Path(os.environ.get("PORTAL_SHARED_DIR") or _DEFAULT_SHARED_DIR)
RECORDED_DIR = SHARED_DIR / "slurmrestd-recorded"
SPEC_DIR = SHARED_DIR / "slurm-openapi"

if not RECORDED_DIR.is_dir() or not SPEC_DIR.is_dir():
    pytest.skip(f"no recorded slurmrestd replies at {SHARED_DIR}", allow_module_level=True)

from jsonschema import Draft7Validator  # noqa: E402
from referencing import Registry, Resource  # noqa: E402
from referencing.jsonschema import DRAFT7  # noqa: E402

from clusters.slurm.codecs import codec_for  # noqa: E402
from clusters.slurm.codecs.data_parser import DataParserCodec  # noqa: E402
from clusters.slurm.errors import SlurmRejected  # noqa: E402
from clusters.slurm.types import (  # noqa: E402
    AccountInfo,
    AccountingRecord,
    AssociationInfo,
    JobState,
    JobSubmission,
    NodeInfo,
    NodeState,
    PartitionInfo,
    SlurmJob,
)

# Recorded replies exist for v0.0.41-v0.0.44; v0.0.40 and v0.0.45 are covered through their schemas.
DATA_PARSER_VERSIONS = ("0.0.40", "0.0.41", "0.0.42", "0.0.43", "0.0.44", "0.0.45")
_RECORDED_JSON = RECORDED_DIR.glob("*/0.0.4[1-4]/*.json")
RECORDED_FILES = sorted(path for path in _RECORDED_JSON if path.name != "status.json")
RECORDED_DIRS = sorted({path.parent for path in RECORDED_FILES})


def _recorded_id(path: Path) -> str:
    """ "25.11/0.0.44/slurm-job-running": the Slurm release, the API version, the reply."""
    return f"{path.parent.parent.name}/{path.parent.name}/{path.stem}"


def _load(relative: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((RECORDED_DIR / f"{relative}.json").read_text())
    return body


def _codec(path: Path) -> DataParserCodec:
    codec = codec_for(path.parent.name)
    assert isinstance(codec, DataParserCodec)
    return codec


def _http_status(path: Path) -> int:
    statuses = json.loads((path.parent / "status.json").read_text())
    # 25.11/0.0.44/slurm-node-with-gpus-allocated.json was recorded without a status entry.
    status: int = statuses.get(path.stem, {}).get("status", 200)
    return status


def _route(name: str) -> str:
    """Which decoder reads a recorded reply, from the name the recorder gave it."""
    if name.startswith("slurmdb-job"):
        return "accounting"
    if name.startswith(("slurm-job", "slurm-jwt")):  # the JWT replies are failed GET /jobs
        return "jobs"
    if name.startswith("slurm-node"):
        return "nodes"
    return {
        "slurm-partitions": "partitions",
        "slurm-ping": "ping",
        "slurm-accounts": "accounts",
        "slurmdb-associations": "associations",
        # The portal keeps no QOS or reservation types: these only have to be clean replies.
        "slurm-qos": "messages-only",
        "slurm-reservations": "messages-only",
    }[name]


# Every recorded reply ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", RECORDED_FILES, ids=_recorded_id)
def test_every_recorded_reply_decodes(path: Path) -> None:
    codec = _codec(path)
    body = json.loads(path.read_text())
    errors = codec.decode_errors(body)
    warnings = codec.decode_warnings(body)
    failed = _http_status(path) != 200 or bool(body.get("errors"))

    if failed:
        # Slurm's own words reach the user: the description of each entry, its number and its source.
        assert len(errors) == len(body["errors"]) > 0
        for message, raw in zip(errors, body["errors"], strict=True):
            assert message.description.startswith(raw["description"])
            assert message.source == raw["source"]
            assert message.error_number == (raw["error_number"] or None)
    else:
        assert errors == ()
    assert len(warnings) == len(body.get("warnings") or [])

    route = _route(path.stem)
    if route == "jobs":
        listing = codec.decode_jobs(body)
        assert all(isinstance(job, SlurmJob) for job in listing.jobs)
        assert all(job.state is not JobState.UNKNOWN and job.gpus >= 0 for job in listing.jobs)
        assert bool(listing.jobs) is not failed
        assert (listing.last_update is None) is failed
    elif route == "accounting":
        records = codec.decode_accounting_jobs(body)
        assert all(isinstance(record, AccountingRecord) for record in records)
        assert all(record.state is not JobState.UNKNOWN and record.elapsed_seconds >= 0 for record in records)
        if not records:
            # slurmdbd answers an unknown job with 200, no error and a warning.
            assert "found nothing" in warnings[0].description
    elif route == "nodes":
        nodes = codec.decode_nodes(body)
        assert all(isinstance(node, NodeInfo) for node in nodes)
        assert all(node.state is not NodeState.UNKNOWN for node in nodes)
        assert all(0 <= node.gpus_used <= node.gpus_total for node in nodes)
        assert bool(nodes) is not failed
    elif route == "partitions":
        partitions = codec.decode_partitions(body)
        assert [partition.name for partition in partitions] == [raw["name"] for raw in body["partitions"]]
        for partition, raw in zip(partitions, body["partitions"], strict=True):
            assert isinstance(partition, PartitionInfo)
            assert len(partition.nodes) == raw["nodes"]["total"]
    elif route == "ping":
        release = path.parent.parent.name
        responding, slurm_release, cluster = codec.decode_ping(body)
        assert responding is True
        assert slurm_release is not None
        assert slurm_release.startswith(release)
        assert cluster == "hpc"
    elif route == "accounts":
        accounts = codec.decode_accounts(body)
        assert [account.name for account in accounts] == [raw["name"] for raw in body["accounts"]]
    elif route == "associations":
        associations = codec.decode_associations(body)
        assert len(associations) == len(body["associations"])
        assert all(association.account and association.cluster == "hpc" for association in associations)
    else:
        assert route == "messages-only"


def test_every_release_and_version_was_found() -> None:
    found = {f"{directory.parent.name}/{directory.name}" for directory in RECORDED_DIRS}
    assert found == {
        "24.05/0.0.41",
        "24.11/0.0.41",
        "24.11/0.0.42",
        "25.05/0.0.41",
        "25.05/0.0.42",
        "25.05/0.0.43",
        "25.11/0.0.41",
        "25.11/0.0.42",
        "25.11/0.0.43",
        "25.11/0.0.44",
    }
    assert len(RECORDED_FILES) >= 500


# Jobs as slurmctld reports them ----------------------------------------------------------------------


def _utc(year: int, month: int, day: int, hour: int, minute: int, second: int) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def _only_job(relative: str) -> SlurmJob:
    codec = codec_for(relative.split("/")[1])
    (job,) = codec.decode_jobs(_load(relative)).jobs
    return job


def test_running_gpu_job_reads_as_a_human_reads_it() -> None:
    job = _only_job("25.11/0.0.44/slurm-job-gpus-running")

    assert job == SlurmJob(
        job_id=5557,
        name="wrap",
        account="biology",
        partition="gpu",
        user_name="jbeck",
        state=JobState.RUNNING,
        state_reason="None",
        comment="",
        submit_time=_utc(2025, 11, 10, 14, 24, 6),
        start_time=_utc(2025, 11, 10, 14, 24, 6),
        end_time=None,  # slurmctld's end_time (start + limit) is a forecast while the job runs
        time_limit_minutes=1,
        gpus=4,
        gpu_type="h100",
        nodes="gpu2",
        exit_code=None,
        # v0.0.44's standard_output is the pattern "slurm-%j.out"; stdout_expanded is the file.
        standard_output="/home/jbeck/slurm-5557.out",
        # 25.11 leaves the stderr path blank: it goes to stdout.
        standard_error="/home/jbeck/slurm-5557.out",
        gpu_indices=(("gpu2", (0, 1, 2, 3)),),  # gres_detail "gpu:h100:4(IDX:0-3)"
    )


@pytest.mark.parametrize("directory", RECORDED_DIRS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_job_states_times_and_exit_codes(directory: Path) -> None:
    prefix = f"{directory.parent.name}/{directory.name}"

    completed = _only_job(f"{prefix}/slurm-job-completed")
    assert (completed.state, completed.exit_code) == (JobState.COMPLETED, 0)
    assert completed.start_time is not None
    assert completed.end_time is not None
    assert completed.start_time <= completed.end_time

    failed = _only_job(f"{prefix}/slurm-job-failed")
    assert (failed.state, failed.state_reason, failed.exit_code) == (JobState.FAILED, "NonZeroExitCode", 1)

    # Killed by SIGTERM at its time limit: exit_code has no return code, only the signal; 128 + 15, as bash says.
    timeout = _only_job(f"{prefix}/slurm-job-timeout")
    assert (timeout.state, timeout.state_reason, timeout.exit_code) == (JobState.TIMEOUT, "TimeLimit", 143)
    assert timeout.end_time is not None

    running = _only_job(f"{prefix}/slurm-job-running")
    assert running.state is JobState.RUNNING
    assert isinstance(running.start_time, datetime)
    assert running.start_time.tzinfo is UTC
    assert (running.end_time, running.exit_code) == (None, None)

    # Pending jobs carry forecast start/end times (their --begin time): not times they started or ended.
    pending = _only_job(f"{prefix}/slurm-job-pending")
    assert pending.state is JobState.PENDING
    assert pending.state_reason in {"BeginTime", "Resources"}
    assert (pending.start_time, pending.end_time, pending.exit_code, pending.nodes) == (None, None, None, "")
    assert pending.submit_time is not None


def test_pending_job_reason() -> None:
    assert _only_job("25.11/0.0.44/slurm-job-pending").state_reason == "BeginTime"
    assert _only_job("25.05/0.0.41/slurm-job-pending").state_reason == "Resources"


def test_exact_failed_and_timeout_jobs() -> None:
    failed = _only_job("24.05/0.0.41/slurm-job-failed")
    assert (failed.job_id, failed.user_name, failed.exit_code) == (649719, "agoodwin", 1)
    assert (failed.start_time, failed.end_time) == (
        _utc(2025, 5, 20, 15, 21, 12),
        _utc(2025, 5, 20, 15, 21, 13),
    )

    timeout = _only_job("25.11/0.0.44/slurm-job-timeout")
    assert (timeout.job_id, timeout.time_limit_minutes, timeout.exit_code) == (5737, 1, 143)
    assert timeout.end_time == _utc(2025, 11, 12, 10, 15, 39)


def test_job_listing_states_and_last_update() -> None:
    listing = codec_for("0.0.44").decode_jobs(_load("25.11/0.0.44/slurm-jobs"))

    assert listing.last_update == _utc(2025, 11, 12, 10, 15, 46)
    states = {job.job_id: job.state for job in listing.jobs}
    assert len(states) == 15
    assert (states[5736], states[5737], states[5738], states[5739]) == (
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.COMPLETED,
        JobState.FAILED,
    )
    assert states[5750] is JobState.PENDING


def test_job_cancelled_before_it_got_nodes_never_started() -> None:
    jobs = {job.job_id: job for job in codec_for("0.0.41").decode_jobs(_load("24.11/0.0.41/slurm-jobs")).jobs}

    cancelled = jobs[5960]
    assert (cancelled.state, cancelled.state_reason, cancelled.nodes) == (JobState.CANCELLED, "BeginTime", "")
    assert cancelled.start_time is None
    assert cancelled.end_time == _utc(2025, 5, 20, 14, 31, 47)


@pytest.mark.parametrize(
    ("relative", "gpus", "gpu_type"),
    [
        # --gpus h100:1
        ("24.05/0.0.41/slurm-job-gpus-type", 1, "h100"),
        ("25.11/0.0.44/slurm-job-gpus-type", 1, "h100"),
        # --gpus 4 / 6: the allocation (gres_detail) names the type the request did not
        ("25.11/0.0.44/slurm-job-gpus-running", 4, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-running", 6, None),  # 2 h100 + 4 h200
        # --gpus-per-node h100:1,h200:1 on a node with both types: two GPUs of two types
        ("24.11/0.0.42/slurm-job-gpus-multi-types", 2, None),
        ("25.05/0.0.41/slurm-job-gpus-multi-types", 2, None),
        ("25.11/0.0.44/slurm-job-gpus-multi-types", 1, "h100"),  # that cluster has only h100s
        # --gpus 8 / 12 over two nodes: one gres_detail entry per node, summed
        ("25.11/0.0.44/slurm-job-gpus-multi-nodes", 8, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-multi-nodes", 12, None),
        # --gpus-per-node 1 --nodes 2; the "gpu:h200:0(IDX:)" entries do not make the type mixed
        ("25.11/0.0.44/slurm-job-gpus-per-node", 2, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-per-node", 2, "h100"),
        # --gpus-per-task 2 --ntasks 2 (tres_per_task is spelt "gres/gpu=2")
        ("25.11/0.0.44/slurm-job-gpus-per-task", 4, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-per-task", 4, None),
        # --gpus-per-socket 2 --sockets-per-node 2: Slurm gave 2
        ("25.11/0.0.44/slurm-job-gpus-per-socket", 2, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-per-socket", 2, "h100"),
        # --gres gpu:4 / gpu:6 (tres_per_node)
        ("25.11/0.0.44/slurm-job-gpus-gres", 4, "h100"),
        ("24.11/0.0.42/slurm-job-gpus-gres", 6, None),
        # Nothing allocated yet or any more: the request
        ("25.11/0.0.44/slurm-job-gpus-pending", 4, None),
        ("24.11/0.0.42/slurm-job-gpus-pending", 6, None),
        ("25.11/0.0.44/slurm-job-gpus-completed", 4, None),
        ("24.05/0.0.41/slurm-job-gpus-completed", 4, None),
        # Recorded before the job ended: still running, still holding its GPUs
        ("25.11/0.0.42/slurm-job-gpus-completed", 4, "h100"),
        # Not a GPU job
        ("25.11/0.0.44/slurm-job-running", 0, None),
    ],
)
def test_job_gpus(relative: str, gpus: int, gpu_type: str | None) -> None:
    job = _only_job(relative)
    assert (job.gpus, job.gpu_type) == (gpus, gpu_type)


@pytest.mark.parametrize(
    ("relative", "job_id", "state", "gpus", "gpu_type"),
    [
        # Cancelled, so gres_detail is gone: the request counts.
        ("25.11/0.0.41/slurm-jobs", 1, JobState.CANCELLED, 2, None),  # --gpus-per-socket 2 on one node
        ("25.11/0.0.44/slurm-jobs", 5736, JobState.CANCELLED, 4, None),
        ("24.11/0.0.42/slurm-jobs", 6356, JobState.CANCELLED, 2, None),  # tres_per_node h100:1,h200:1
        ("25.05/0.0.42/slurm-jobs", 4759, JobState.CANCELLED, 1, "h100"),
        ("25.05/0.0.43/slurm-jobs", 4728, JobState.CANCELLED, 4, None),
    ],
)
def test_gpus_of_finished_jobs_in_listings(
    relative: str, job_id: int, state: JobState, gpus: int, gpu_type: str | None
) -> None:
    codec = codec_for(relative.split("/")[1])
    job = next(job for job in codec.decode_jobs(_load(relative)).jobs if job.job_id == job_id)
    assert (job.state, job.gpus, job.gpu_type) == (state, gpus, gpu_type)


def test_allocated_gpus_in_tres_alloc_str_win() -> None:
    # None of the recorded clusters tracks gres/gpu in AccountingStorageTRES, the local cluster does.
    body = _load("25.11/0.0.44/slurm-job-gpus-per-task")
    body["jobs"][0]["tres_alloc_str"] = "cpu=2,mem=1G,node=1,billing=2,gres/gpu=3,gres/gpu:h100=3"

    (job,) = codec_for("0.0.44").decode_jobs(body).jobs
    assert (job.gpus, job.gpu_type) == (3, "h100")


def test_output_paths_per_version() -> None:
    # v0.0.41/42 give the resolved path; 25.11 leaves stderr blank in every version.
    older = _only_job("25.11/0.0.41/slurm-job-completed")
    assert (older.standard_output, older.standard_error) == (
        "/home/jthomas/slurm-14.out",
        "/home/jthomas/slurm-14.out",
    )
    explicit = _only_job("24.05/0.0.41/slurm-job-completed")
    assert explicit.standard_error == "/home/tpearson/slurm-649718.out"
    # v0.0.43+ give the raw pattern in standard_output and the resolved path in stdout_expanded.
    newer = _only_job("25.11/0.0.43/slurm-job-completed")
    assert (newer.standard_output, newer.standard_error) == (
        "/home/jbeck/slurm-5760.out",
        "/home/jbeck/slurm-5760.out",
    )


# Accounting -----------------------------------------------------------------------------------------


def _only_record(relative: str) -> AccountingRecord:
    (record,) = codec_for(relative.split("/")[1]).decode_accounting_jobs(_load(relative))
    return record


def test_accounting_record_of_a_finished_gpu_job() -> None:
    record = _only_record("25.11/0.0.44/slurmdb-job-gpus-completed")

    assert record == AccountingRecord(
        job_id=5141,
        name="wrap",
        account="acoustic",
        user_name="acuevas",
        partition="gpu",
        cluster="hpc",
        state=JobState.COMPLETED,
        comment="",
        submit_time=_utc(2025, 11, 10, 14, 19, 19),
        start_time=_utc(2025, 11, 10, 14, 19, 19),
        end_time=_utc(2025, 11, 10, 14, 19, 50),
        elapsed_seconds=31,
        # `sbatch --gpus 4`, but the recording cluster's AccountingStorageTRES lacks gres/gpu:
        # slurmdbd recorded no GPU at all, and the codec does not invent one.
        gpus_allocated=0,
        gpu_type=None,
        exit_code=0,
        nodes="gpu1",
        time_limit_minutes=1,
    )


@pytest.mark.parametrize(
    ("relative", "state", "elapsed_seconds", "exit_code"),
    [
        ("25.11/0.0.44/slurmdb-job-completed", JobState.COMPLETED, 30, 0),
        ("25.11/0.0.44/slurmdb-job-failed", JobState.FAILED, 2, 1),
        # slurmdbd's job record of a time-limited job says 0; the signal is on the batch step.
        ("25.11/0.0.44/slurmdb-job-timeout", JobState.TIMEOUT, 82, 0),
        ("25.11/0.0.44/slurmdb-job-archived", JobState.CANCELLED, 1, 0),
        ("25.11/0.0.44/slurmdb-job-running", JobState.RUNNING, 72, None),
        ("25.11/0.0.44/slurmdb-job-pending", JobState.PENDING, 0, None),
        ("24.05/0.0.41/slurmdb-job-timeout", JobState.TIMEOUT, 83, 0),
        ("24.11/0.0.42/slurmdb-job-completed", JobState.COMPLETED, 61, 0),
        ("25.05/0.0.43/slurmdb-job-gpus-completed", JobState.COMPLETED, 31, 0),
    ],
)
def test_accounting_states_elapsed_and_exit_codes(
    relative: str, state: JobState, elapsed_seconds: int, exit_code: int | None
) -> None:
    record = _only_record(relative)
    assert (record.state, record.elapsed_seconds, record.exit_code) == (state, elapsed_seconds, exit_code)
    assert record.gpu_seconds == 0


def test_accounting_times_unset() -> None:
    running = _only_record("25.11/0.0.44/slurmdb-job-running")
    assert running.start_time == _utc(2025, 11, 12, 10, 14, 35)
    assert running.end_time is None

    pending = _only_record("25.11/0.0.44/slurmdb-job-pending")
    assert (pending.start_time, pending.end_time) == (None, None)


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_accounting_allocated_gpus_and_comment(version: str) -> None:
    # The recorded replies have no GPU TRES; this is how slurmdbd lists them where it tracks gres/gpu.
    body = _load("25.11/0.0.44/slurmdb-job-gpus-completed")
    job = body["jobs"][0]
    job["tres"]["allocated"] += [
        {"type": "gres", "name": "gpu", "id": 1001, "count": 4},
        {"type": "gres", "name": "gpu:h100", "id": 1002, "count": 4},
    ]
    job["comment"] = {"administrator": "checked", "job": "portal:job:7f3e", "system": "requeued"}

    (record,) = codec_for(version).decode_accounting_jobs(body)
    assert (record.gpus_allocated, record.gpu_type, record.gpu_seconds) == (4, "h100", 124)
    assert record.comment == "portal:job:7f3e"


def test_accounting_typed_gpus_only() -> None:
    body = _load("25.11/0.0.44/slurmdb-job-gpus-completed")
    body["jobs"][0]["tres"]["allocated"] += [
        {"type": "gres", "name": "gpu:h100", "id": 1002, "count": 2},
        {"type": "gres", "name": "gpu:h200", "id": 1003, "count": 1},
    ]
    (record,) = codec_for("0.0.44").decode_accounting_jobs(body)
    assert (record.gpus_allocated, record.gpu_type) == (3, None)


# Nodes and partitions -------------------------------------------------------------------------------


def _only_node(relative: str) -> NodeInfo:
    (node,) = codec_for(relative.split("/")[1]).decode_nodes(_load(relative))
    return node


def test_gpu_node_mixed() -> None:
    assert _only_node("25.11/0.0.44/slurm-node-with-gpus-model-mixed") == NodeInfo(
        name="gpu1",
        state=NodeState.MIXED,
        state_flags=("MIXED",),
        reason="",
        partitions=("gpu",),
        cpus=32,
        cpus_allocated=1,
        real_memory_mb=524288,
        gpu_type="h100",
        gpus_total=4,
        gpus_used=1,
    )


@pytest.mark.parametrize(
    ("relative", "state", "gpu_type", "gpus_total", "gpus_used"),
    [
        ("25.11/0.0.44/slurm-node-with-gpus-allocated", NodeState.ALLOCATED, "h100", 4, 4),
        ("25.11/0.0.44/slurm-node-with-gpus-mixed", NodeState.MIXED, None, 4, 1),  # untyped "gpu:4"
        ("24.11/0.0.41/slurm-node-with-gpus-allocated", NodeState.ALLOCATED, None, 4, 4),
        ("24.11/0.0.42/slurm-node-with-gpus-model-allocated", NodeState.ALLOCATED, None, 6, 6),  # h100 + h200
        # IDLE+COMPLETING, "gpu:h100:0(IDX:N/A)" used
        ("25.05/0.0.43/slurm-node-with-gpus-model-idle", NodeState.IDLE, "h100", 4, 0),
        ("25.05/0.0.41/slurm-node-with-gpus-model-mixed", NodeState.MIXED, "h100", 4, 2),
        ("25.11/0.0.44/slurm-node-without-gpu", NodeState.IDLE, None, 0, 0),
    ],
)
def test_node_gpus(
    relative: str,
    state: NodeState,
    gpu_type: str | None,
    gpus_total: int,
    gpus_used: int,
) -> None:
    node = _only_node(relative)
    assert (node.state, node.gpu_type, node.gpus_total, node.gpus_used) == (
        state,
        gpu_type,
        gpus_total,
        gpus_used,
    )


@pytest.mark.parametrize(
    ("name", "state", "reason"),
    [
        ("slurm-node-idle", NodeState.IDLE, ""),
        ("slurm-node-mixed", NodeState.MIXED, ""),
        ("slurm-node-allocated", NodeState.ALLOCATED, ""),
        ("slurm-node-drain", NodeState.DRAINED, "ECC memory error"),  # IDLE+DRAIN
        ("slurm-node-down", NodeState.DOWN, "CPU dead"),
    ],
)
@pytest.mark.parametrize("directory", RECORDED_DIRS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_node_states(directory: Path, name: str, state: NodeState, reason: str) -> None:
    node = _only_node(f"{directory.parent.name}/{directory.name}/{name}")
    assert (node.state, node.reason) == (state, reason)


@pytest.mark.parametrize("prefix", ["24.05/0.0.41", "25.11/0.0.41", "25.11/0.0.44"])
def test_node_draining(prefix: str) -> None:
    node = _only_node(f"{prefix}/slurm-node-draining")
    assert (node.state, node.state_flags, node.reason) == (
        NodeState.DRAINING,
        ("MIXED", "DRAIN"),
        "ECC memory error",
    )
    assert node.cpus_allocated > 0


def test_node_extra_flags_are_kept() -> None:
    node = _only_node("25.11/0.0.42/slurm-node-planned")
    assert (node.state, node.state_flags) == (NodeState.IDLE, ("IDLE", "COMPLETING", "PLANNED"))


def test_partitions() -> None:
    normal, gpu = codec_for("0.0.44").decode_partitions(_load("25.11/0.0.44/slurm-partitions"))
    assert normal == PartitionInfo(
        name="normal",
        nodes=("cn1", "cn2", "cn3", "cn4"),
        max_time_minutes=120,
        default_time_minutes=None,  # unset
        # The data_parser partition info has no Default=YES marker in any version.
        is_default=False,
        state="UP",
    )
    assert gpu.nodes == ("gpu1", "gpu2")

    batch, debug, *_ = codec_for("0.0.41").decode_partitions(_load("24.05/0.0.41/slurm-partitions"))
    assert (batch.max_time_minutes, len(batch.nodes), batch.nodes[0], batch.nodes[-1]) == (
        None,
        512,
        "cn001",
        "cn532",
    )
    assert debug.max_time_minutes == 60


def test_default_partition_from_v0_0_45() -> None:
    # v0.0.45 adds top-level partition flags; 26.05.5 says ["DEFAULT"] for a Default=YES partition.
    body = _load("25.11/0.0.44/slurm-partitions")
    body["partitions"][0]["flags"] = ["DEFAULT"]
    body["partitions"][1]["flags"] = []

    normal, gpu = codec_for("0.0.45").decode_partitions(body)

    assert (normal.is_default, gpu.is_default) == (True, False)


# Ping, errors, warnings -----------------------------------------------------------------------------


def test_ping() -> None:
    # v0.0.41 says only pinged: "UP"; v0.0.42 adds responding: true.
    assert codec_for("0.0.41").decode_ping(_load("24.05/0.0.41/slurm-ping")) == (True, "24.05.3", "hpc")
    assert codec_for("0.0.42").decode_ping(_load("24.11/0.0.42/slurm-ping")) == (True, "24.11.5", "hpc")
    assert codec_for("0.0.44").decode_ping(_load("25.11/0.0.44/slurm-ping")) == (True, "25.11.0", "hpc")


def test_ping_not_responding() -> None:
    body = _load("25.11/0.0.44/slurm-ping")
    body["pings"][0].update(pinged="DOWN", responding=False)
    assert codec_for("0.0.44").decode_ping(body)[0] is False
    older = _load("25.11/0.0.41/slurm-ping")
    older["pings"][0]["pinged"] = "DOWN"
    assert codec_for("0.0.41").decode_ping(older)[0] is False


@pytest.mark.parametrize(
    ("version", "ping", "responding"),
    [
        # As 24.11.5 and 26.05.5 answered here: v0.0.40 has only `pinged`, v0.0.45 dropped it.
        ("0.0.40", {"hostname": "vm", "pinged": "UP", "latency": 1643, "mode": "primary"}, True),
        ("0.0.40", {"hostname": "vm", "pinged": "DOWN", "latency": 0, "mode": "primary"}, False),
        ("0.0.45", {"hostname": "vm", "responding": True, "latency": 974, "primary": True, "status": "No error"}, True),
        ("0.0.45", {"hostname": "vm", "responding": False, "latency": 0, "primary": True, "status": "Down"}, False),
    ],
)
def test_ping_of_the_versions_without_recordings(version: str, ping: dict[str, Any], responding: bool) -> None:
    meta = {
        "slurm": {"version": {"major": "26", "micro": "5", "minor": "05"}, "release": "26.05.5", "cluster": "south"}
    }
    body = {"pings": [ping], "meta": meta, "errors": [], "warnings": []}
    _assert_matches_schema(version, "openapi_ping_array_resp", body)

    assert codec_for(version).decode_ping(body) == (responding, "26.05.5", "south")


def test_errors_keep_slurm_words_number_and_source() -> None:
    codec = codec_for("0.0.44")

    (unfound,) = codec.decode_errors(_load("25.11/0.0.44/slurm-job-unfound"))
    assert unfound.description == "Unable to query JobId=11500: Invalid job id specified"
    assert (unfound.error_number, unfound.source) == (2017, "_handle_job_get")

    (expired,) = codec.decode_errors(_load("25.11/0.0.44/slurm-jwt-expired-token"))
    assert expired.description == "Unable to query jobs: Protocol authentication error"
    assert (expired.error_number, expired.source) == (1007, "slurm_load_jobs()")

    # errno 0 comes with the text "No error", which must not reach the user.
    (node,) = codec.decode_errors(_load("25.11/0.0.44/slurm-node-unfound"))
    assert (node.description, node.error_number, node.source) == (
        "Failure to query node unexisting-node",
        None,
        "_dump_nodes",
    )

    # 24.05 answers an invalid token with HTTP 500 and error -1, not 1007.
    (invalid,) = codec_for("0.0.41").decode_errors(_load("24.05/0.0.41/slurm-jwt-invalid-token"))
    assert (invalid.description, invalid.error_number) == ("Unable to query jobs: Unspecified error", -1)


def test_warnings() -> None:
    body = _load("25.11/0.0.44/slurmdb-job-unfound")
    codec = codec_for("0.0.44")

    assert codec.decode_errors(body) == ()
    (warning,) = codec.decode_warnings(body)
    assert (warning.description, warning.source) == ("slurmdb_jobs_get() found nothing", "_dump_jobs")
    assert codec.decode_accounting_jobs(body) == []


# Accounts and associations --------------------------------------------------------------------------


def test_accounts() -> None:
    accounts = codec_for("0.0.44").decode_accounts(_load("25.11/0.0.44/slurm-accounts"))
    assert len(accounts) == 7
    assert accounts[5] == AccountInfo(name="root", description="default root account", organization="root")
    assert accounts[0] == AccountInfo(name="acoustic", description="acoustic", organization="physic")


def test_associations() -> None:
    associations = codec_for("0.0.44").decode_associations(_load("25.11/0.0.44/slurmdb-associations"))
    assert len(associations) == 18
    assert AssociationInfo("acoustic", "hpc", "", "physic", None) in associations
    # A user's association names no parent: the parent is the account's.
    assert AssociationInfo("acoustic", "hpc", "acuevas", "", None) in associations
    assert all(association.gpu_minutes_limit is None for association in associations)


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_gpu_minutes_limit_round_trip(version: str) -> None:
    codec = codec_for(version)
    limited = AssociationInfo("acoustic", "hpc", "", "physic", 6000)
    member = AssociationInfo("acoustic", "hpc", "acuevas", "", None)

    payload = codec.encode_associations([limited, member])

    assert payload["associations"][0]["max"] == {
        "tres": {"group": {"minutes": [{"type": "gres", "name": "gpu", "count": 6000}]}}
    }
    assert "max" not in payload["associations"][1]
    _assert_matches_schema(version, "openapi_assocs_resp", payload)
    # Read back as slurmdbd reports it, beside a typed entry that is not the account's GrpTRESMins=gres/gpu.
    payload["associations"][0]["max"]["tres"]["group"]["minutes"].insert(
        0, {"type": "gres", "name": "gpu:h100", "id": 1002, "count": 100}
    )
    assert codec.decode_associations(payload) == [limited, member]


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_encode_accounts(version: str) -> None:
    account = AccountInfo(name="proj-42", description="Protein folding", organization="acme")
    payload = codec_for(version).encode_accounts([account], parent_account="acme")

    expected = [{"name": "proj-42", "description": "Protein folding", "organization": "acme"}]
    assert payload == {"accounts": expected}
    _assert_matches_schema(version, "openapi_accounts_resp", payload)


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_encode_account_creation(version: str) -> None:
    account = AccountInfo(name="proj-42", description="Protein folding", organization="acme")
    creation = codec_for(version).encode_account_creation(
        account, cluster="hpc", parent_account="acme", gpu_minutes_limit=600
    )

    assert creation is not None
    path, payload = creation
    assert f"/slurmdb/v{version}{path}" in _spec(version)["paths"]
    _assert_matches_schema(version, "openapi_accounts_add_cond_resp", payload)


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_association_query_uses_the_versions_parameter_names(version: str) -> None:
    codec = codec_for(version)
    assert isinstance(codec, DataParserCodec)
    params = codec.association_query_params(account="acoustic", cluster="hpc", include_deleted=True)

    spec = _spec(version)
    parameters = spec["paths"][f"/slurmdb/v{version}/associations/"]["get"]["parameters"]
    declared = {parameter["name"] for parameter in parameters}
    assert set(params) <= declared
    assert ("with_deleted" in params) is (version in {"0.0.40", "0.0.41"})


# Submission -----------------------------------------------------------------------------------------


SUBMISSIONS = {
    "typed-gpus": JobSubmission(
        name="train",
        account="acoustic",
        partition="gpu",
        script="#!/bin/bash\nsrun python train.py\n",
        time_limit_minutes=90,
        working_directory="/scratch/acuevas",
        standard_output="/scratch/acuevas/train-%j.out",
        standard_error="/scratch/acuevas/train-%j.err",
        gpus=2,
        gpu_type="h100",
        environment={"OMP_NUM_THREADS": "4", "PATH": "/usr/local/bin:/usr/bin:/bin"},
        comment="portal:job:7f3e",
    ),
    "untyped-gpu-held": JobSubmission(
        name="eval",
        account="acoustic",
        partition="gpu",
        script="#!/bin/bash\npython eval.py\n",
        time_limit_minutes=10,
        working_directory="/scratch/acuevas",
        standard_output="/scratch/acuevas/eval.out",
        standard_error="/scratch/acuevas/eval.out",
        gpus=1,
        hold=True,
        environment={"LANG": "C.UTF-8"},
    ),
    "cpus-memory-nodes": JobSubmission(
        name="prep",
        account="optic",
        partition="normal",
        script="#!/bin/bash\nsrun hostname\n",
        time_limit_minutes=5,
        working_directory="/scratch/sevans",
        standard_output="/scratch/sevans/prep.out",
        standard_error="/scratch/sevans/prep.err",
        cpus=8,
        memory_mb=32000,
        nodes=2,
        environment={"A": "1"},
    ),
    "multi-node-one-switch": JobSubmission(
        name="ddp",
        account="optic",
        partition="gpu",
        script="#!/bin/bash\nsrun --ntasks-per-node=1 hostname\n",
        time_limit_minutes=30,
        working_directory="/scratch/sevans",
        standard_output="/scratch/sevans/ddp.out",
        standard_error="/scratch/sevans/ddp.err",
        gpus=4,
        gpu_type="h100",
        nodes=2,
        max_switches=1,
        switch_wait_seconds=600,
        one_switch_constraint="[switch-leaf1|switch-leaf2]",
        environment={"A": "1"},
    ),
    "empty-environment": JobSubmission(
        name="bare",
        account="optic",
        partition="normal",
        script="#!/bin/bash\ntrue\n",
        time_limit_minutes=1,
        working_directory="/scratch/sevans",
        standard_output="/scratch/sevans/bare.out",
        standard_error="/scratch/sevans/bare.out",
    ),
}


@pytest.mark.parametrize("name", SUBMISSIONS)
@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_encode_submit_matches_the_versions_schema(version: str, name: str) -> None:
    submission = SUBMISSIONS[name]

    payload = codec_for(version).encode_submit(submission)

    _assert_matches_schema(version, "job_submit_req", payload)
    job = payload["job"]
    assert set(payload) == {"job"}
    assert job["script"] == submission.script
    assert job["time_limit"] == {"set": True, "infinite": False, "number": submission.time_limit_minutes}
    assert job["nodes"] == str(submission.nodes)
    assert job["hold"] is submission.hold
    assert not {"gpus", "gres", "gpus_per_node"} & set(job)
    assert job["environment"]


def test_encoded_fields() -> None:
    codec = codec_for("0.0.44")

    typed = codec.encode_submit(SUBMISSIONS["typed-gpus"])["job"]
    assert typed["tres_per_job"] == "gres/gpu:h100:2"
    assert typed["environment"] == ["OMP_NUM_THREADS=4", "PATH=/usr/local/bin:/usr/bin:/bin"]
    assert (typed["comment"], typed["current_working_directory"]) == ("portal:job:7f3e", "/scratch/acuevas")
    assert typed["standard_error"] == "/scratch/acuevas/train-%j.err"

    held = codec.encode_submit(SUBMISSIONS["untyped-gpu-held"])["job"]
    assert (held["tres_per_job"], held["hold"]) == ("gres/gpu:1", True)

    sized = codec.encode_submit(SUBMISSIONS["cpus-memory-nodes"])["job"]
    assert "tres_per_job" not in sized
    assert (sized["cpus_per_task"], sized["minimum_cpus"], sized["nodes"]) == (8, 8, "2")
    assert sized["memory_per_node"] == {"set": True, "infinite": False, "number": 32000}

    bare = codec.encode_submit(SUBMISSIONS["empty-environment"])["job"]
    assert bare["environment"] == ["PATH=/usr/bin:/bin"]
    assert not {"cpus_per_task", "minimum_cpus", "memory_per_node", "tres_per_job"} & set(bare)


def test_a_multi_node_job_asks_for_gpus_per_node_and_its_switches() -> None:
    job = codec_for("0.0.44").encode_submit(SUBMISSIONS["multi-node-one-switch"])["job"]

    assert (job["nodes"], job["tres_per_node"]) == ("2", "gres/gpu:h100:4")
    assert "tres_per_job" not in job
    assert job["required_switches"] == {"set": True, "infinite": False, "number": 1}
    assert job["wait_for_switch"] == 600
    assert "constraints" not in job


def test_v0_0_38_asks_for_one_switch_as_a_constraint_over_the_switch_features() -> None:
    # 22.05's v0.0.38 answers required_switches with 'Disabled key: "required_switches"' (measured).
    job = codec_for("0.0.38").encode_submit(SUBMISSIONS["multi-node-one-switch"])["job"]

    assert (job["nodes"], job["gpus_per_node"]) == (2, "h100:4")
    assert "gpus" not in job
    assert job["constraints"] == "[switch-leaf1|switch-leaf2]"
    assert not {"required_switches", "wait_for_switch"} & set(job)
    single = codec_for("0.0.38").encode_submit(SUBMISSIONS["typed-gpus"])["job"]
    assert (single["nodes"], single["gpus"]) == (1, "h100:2")
    assert not {"gpus_per_node", "constraints"} & set(single)


@pytest.mark.parametrize(
    ("version", "features"),
    [("0.0.38", "nvlink,switch-leaf2"), ("0.0.42", ["nvlink", "switch-leaf2"]), ("0.0.45", ["switch-leaf2"])],
)
def test_a_nodes_switch_is_read_from_its_switch_feature(version: str, features: Any) -> None:
    node = {"name": "gpu03", "state": "IDLE" if version == "0.0.38" else ["IDLE"], "features": features}
    bare = {**node, "name": "gpu04", "features": "" if version == "0.0.38" else []}

    decoded = codec_for(version).decode_nodes({"nodes": [node, bare]})

    assert [(info.name, info.switch) for info in decoded] == [("gpu03", "leaf2"), ("gpu04", "")]


def test_decode_submit() -> None:
    codec = codec_for("0.0.44")
    body = {
        "job_id": 5801,
        "step_id": "batch",
        "job_submit_user_msg": "GPU jobs are billed per GPU-hour",
        "errors": [{"description": "Job is in held state", "error_number": 2042, "source": "_submit"}],
        "warnings": [{"description": 'Ignoring unknown field "gres"', "source": "parse"}],
    }

    result = codec.decode_submit(body)

    assert result.job_id == 5801
    assert result.user_message == "GPU jobs are billed per GPU-hour"
    assert [message.description for message in result.warnings] == [
        'Ignoring unknown field "gres"',
        "Job is in held state",
    ]


def test_decode_submit_without_job_id_is_rejected() -> None:
    body = {"errors": [{"description": "Invalid account", "error_number": 2045, "source": "_submit"}]}

    with pytest.raises(SlurmRejected) as raised:
        codec_for("0.0.41").decode_submit(body)

    assert raised.value.messages[0].description.startswith("Invalid account")


# Schema helpers -------------------------------------------------------------------------------------


_SPECS: dict[str, dict[str, Any]] = {}


def _spec(version: str) -> dict[str, Any]:
    if version not in _SPECS:
        if version == "0.0.38":  # from Slurm 22.05's own tree, named after its slurmctld half
            path = SPEC_DIR / "slurm-v0.0.38.json"
        elif version == "0.0.40":  # no file of its own: the one 24.11.5's slurmrestd served, with v0.0.41/42
            path = RECORDED_DIR / "24.11" / "openapi-v3.json"
        else:
            path = SPEC_DIR / f"v{version}.json"
        _SPECS[version] = json.loads(path.read_text())
    return _SPECS[version]


def _assert_matches_schema(version: str, schema_name: str, payload: dict[str, Any]) -> None:
    """Valid against the spec's schema, and every key one the schema declares.

    slurmrestd ignores unknown keys with no more than a warning, so an undeclared key is a request
    silently dropped (a GPU request among them); the schemas allow extra keys, hence the walk.
    """
    spec = _spec(version)
    uri = f"urn:slurm-openapi:v{version}"
    resource: Resource[Any] = Resource.from_contents(spec, default_specification=DRAFT7)
    registry: Registry[Any] = Registry().with_resource(uri, resource)
    name = f"v{version}_{schema_name}"
    validator = Draft7Validator({"$ref": f"{uri}#/components/schemas/{name}"}, registry=registry)
    problems = [f"{error.json_path}: {error.message}" for error in validator.iter_errors(payload)]
    assert problems == []
    assert _undeclared_keys(payload, spec["components"]["schemas"][name], spec) == []


def _undeclared_keys(value: Any, schema: dict[str, Any], spec: dict[str, Any], path: str = "") -> list[str]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].removeprefix("#/components/schemas/")]
    if isinstance(value, dict) and "properties" in schema:
        undeclared = []
        for key, item in value.items():
            if key not in schema["properties"]:
                undeclared.append(f"{path}{key}")
            else:
                undeclared += _undeclared_keys(item, schema["properties"][key], spec, f"{path}{key}.")
        return undeclared
    if isinstance(value, list) and "items" in schema:
        return [key for item in value for key in _undeclared_keys(item, schema["items"], spec, f"{path}[].")]
    return []


def test_schema_walk_catches_an_undeclared_gpu_key() -> None:
    payload = codec_for("0.0.44").encode_submit(SUBMISSIONS["typed-gpus"])
    payload["job"]["gpus"] = "h100:2"

    assert _undeclared_keys(
        payload, _spec("0.0.44")["components"]["schemas"]["v0.0.44_job_submit_req"], _spec("0.0.44")
    ) == ["job.gpus"]


@pytest.mark.parametrize("name", list(SUBMISSIONS))
def test_v0_0_38_submit_payloads_match_the_v0_0_38_spec(name: str) -> None:
    payload = codec_for("0.0.38").encode_submit(SUBMISSIONS[name])
    # The spec says [min, max]; 22.05.8 runs a job sent [2, 2] on one node and honours a plain count only
    # (measured, clusters/slurm/codecs/v0_0_38.py).
    assert payload["job"].pop("nodes") == SUBMISSIONS[name].nodes

    _assert_matches_schema("0.0.38", "job_submission", payload)


# What each decoder reads, declared by each version's schema -------------------------------------------


def _under(prefix: str, *fields: str) -> list[str]:
    return [f"{prefix}{field}" for field in fields]


_READ_FIELDS = {
    "openapi_job_info_resp": [
        *_under("jobs[].", "job_id", "name", "account", "partition", "user_name", "job_state", "state_reason"),
        *_under("jobs[].", "comment", "submit_time", "start_time", "end_time", "time_limit", "restart_cnt"),
        *_under("jobs[].", "nodes", "node_count", "tasks", "standard_output", "standard_error"),
        *_under("jobs[].", "tres_alloc_str", "gres_detail", "tres_per_job", "tres_per_node", "tres_per_task"),
        *_under("jobs[].", "tres_per_socket"),
        *_under("jobs[].exit_code.", "status", "return_code.number", "signal.id.number"),
        "last_update.number",
        *_under("errors[].", "description", "error_number", "source"),
        "warnings[].description",
    ],
    "openapi_slurmdbd_jobs_resp": [
        *_under("jobs[].", "job_id", "name", "account", "user", "partition", "cluster"),
        *_under("jobs[].", "state.current", "comment.job", "tres.allocated[].count"),
        *_under("jobs[].time.", "submission", "start", "end", "elapsed"),
        *_under("jobs[].exit_code.", "status", "return_code.number", "signal.id.number"),
    ],
    "openapi_nodes_resp": _under(
        "nodes[].",
        "name",
        "state",
        "reason",
        "partitions",
        "cpus",
        "alloc_cpus",
        "real_memory",
        "gres",
        "gres_used",
        "features",
    ),
    "openapi_partition_resp": _under(
        "partitions[].", "name", "nodes.configured", "maximums.time.number", "defaults.time.number", "partition.state"
    ),
    "openapi_accounts_resp": _under("accounts[].", "name", "description", "organization"),
    "openapi_assocs_resp": _under(
        "associations[].", "account", "cluster", "user", "parent_account", "max.tres.group.minutes[].count"
    ),
    "openapi_job_submit_response": ["job_id", "job_submit_user_msg"],
}


def _schema_at(version: str, schema_name: str, dotted: str) -> dict[str, Any] | None:
    """The schema of a field ("jobs[].exit_code.status") of a named schema; None where it is not declared."""
    spec = _spec(version)
    schemas = spec["components"]["schemas"]

    def resolved(schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = schemas[schema["$ref"].removeprefix("#/components/schemas/")]
        return schema

    schema = resolved(schemas[f"v{version}_{schema_name}"])
    for part in dotted.split("."):
        name, is_list = part.removesuffix("[]"), part.endswith("[]")
        child = schema.get("properties", {}).get(name)
        if child is None:
            return None
        schema = resolved(child)
        if is_list:
            schema = resolved(schema["items"])
    return schema


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_fields_the_decoders_read_are_in_the_versions_schema(version: str) -> None:
    missing = [
        f"{schema_name}: {field}"
        for schema_name, fields in _READ_FIELDS.items()
        for field in fields
        if _schema_at(version, schema_name, field) is None
    ]
    assert missing == []
    # Per version: where the ping says it answered, the expanded output paths, the partition flags.
    older = version in {"0.0.40", "0.0.41"}
    assert (_schema_at(version, "openapi_ping_array_resp", "pings[].pinged") is not None) is (version != "0.0.45")
    assert (_schema_at(version, "openapi_ping_array_resp", "pings[].responding") is not None) is not older
    expanded = _schema_at(version, "openapi_job_info_resp", "jobs[].stdout_expanded")
    assert (expanded is not None) is (version >= "0.0.43")
    assert (_schema_at(version, "openapi_partition_resp", "partitions[].flags") is not None) is (version == "0.0.45")


# GPU devices and GPU usage (jobs/gpu_utilisation.py) --------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "gpu_indices"),
    [
        ("25.11/0.0.44/slurm-job-gpus-running", (("gpu2", (0, 1, 2, 3)),)),
        # Two types on one node: the devices of both, by index
        ("24.11/0.0.42/slurm-job-gpus-running", (("ia1", (0, 1, 2, 3, 4, 5)),)),
        # One gres_detail entry per node of the node list, in its order; "gpu:h200:0(IDX:)" holds none
        ("24.11/0.0.42/slurm-job-gpus-per-node", (("ia1", (0,)), ("ia2", (0,)))),
        ("24.05/0.0.41/slurm-job-gpus-multi-nodes", (("gpu1", (0, 1, 2, 3)), ("gpu2", (0, 1, 2, 3)))),
        ("24.11/0.0.42/slurm-job-gpus-multi-types", (("ia1", (0, 2)),)),
        ("24.11/0.0.42/slurm-job-gpus-per-socket", (("ia1", (0, 1)),)),
        # Nothing held: pending, or ended (gres_detail is gone)
        ("25.11/0.0.44/slurm-job-gpus-pending", ()),
        ("25.11/0.0.44/slurm-job-gpus-completed", ()),
        ("25.11/0.0.44/slurm-job-running", ()),
    ],
)
def test_gpu_devices_a_job_holds(relative: str, gpu_indices: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
    assert _only_job(relative).gpu_indices == gpu_indices


@pytest.mark.parametrize(
    "relative", sorted(_recorded_id(path) for path in RECORDED_FILES if "slurmdb-job-" in path.name)
)
def test_recorded_accounting_has_no_gpu_usage_and_none_is_invented(relative: str) -> None:
    """None of the recording clusters recorded gres/gpuutil or gres/gpumem (no NVML there): their steps' TRES
    usage lists are empty, and the codec reports "not recorded", not 0 %."""
    codec = codec_for(relative.split("/")[1])
    for record in codec.decode_accounting_jobs(_load(relative)):
        assert (record.gpu_utilisation_percent, record.gpu_memory_peak_bytes) == (None, None)


@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_gpu_usage_from_the_steps_tres_usage(version: str) -> None:
    # The recorded reply's steps, with the usage entries slurmdbd adds where AccountingStorageTRES has
    # gres/gpuutil,gres/gpumem and the gpu plugin reads NVML (sacct: TRESUsageInAve gres/gpuutil=.., TRESUsageInMax
    # gres/gpumem=..): the batch step mostly idle, a second step busier; memory is bytes.
    body = _load("25.11/0.0.44/slurmdb-job-gpus-completed")
    steps = body["jobs"][0]["steps"]
    steps.append(copy.deepcopy(steps[0]))  # the recorded job has its batch step only: a second, as srun adds
    steps[0]["tres"]["requested"]["average"] += [{"type": "gres", "name": "gpuutil", "id": 1003, "count": 4}]
    steps[0]["tres"]["requested"]["max"] += [{"type": "gres", "name": "gpumem", "id": 1004, "count": 22_768_582_656}]
    steps[1]["tres"]["requested"]["average"] += [{"type": "gres", "name": "gpuutil", "id": 1003, "count": 61}]
    steps[1]["tres"]["requested"]["max"] += [{"type": "gres", "name": "gpumem", "id": 1004, "count": 1_428_160_512}]

    (record,) = codec_for(version).decode_accounting_jobs(body)
    assert (record.gpu_utilisation_percent, record.gpu_memory_peak_bytes) == (61.0, 22_768_582_656)
