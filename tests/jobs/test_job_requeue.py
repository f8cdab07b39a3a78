"""A node fails under running jobs: Slurm requeues a batch job (a new attempt) or ends it as NODE_FAIL.

The shapes are those slurmrestd 22.05 (v0.0.38, dbv0.0.38) returned on the local cluster after
`scontrol update nodename=gpu01 state=down` under two running jobs (scripts/drills/drill_node_down.py does it
live): the requeued job was listed PENDING (reason BeginTime, restart_cnt 1, no nodes, submit time = the
moment of the requeue) and accounting held two records under its id, the cut-short run as NODE_FAIL with
its 7 s and then the new attempt; the job submitted with --no-requeue was listed NODE_FAIL (reason NodeDown).
A stand-in client answers the sync with these bodies, decoded by the real codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from clusters.slurm.codecs.v0_0_38 import CODEC
from clusters.slurm.types import AccountingRecord, JobsListing
from jobs.job_sync import cluster_jobs_sync
from jobs.models import Job, JobState
from tests.factories import make_job

pytestmark = pytest.mark.django_db

SUBMITTED = 1795289626
STARTED = SUBMITTED + 1
NODE_DOWN = SUBMITTED + 8  # the requeue: the first run ends, the job's new submit time
RESTARTED = NODE_DOWN + 123  # BeginTime: 2 minutes (the credential lifetime) after the requeue
FINISHED = RESTARTED + 60


def _moment(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


@dataclass
class RecordedSlurm:
    """Answers the sync with the recorded bodies set on it."""

    listed: list[dict[str, Any]]
    accounting: list[dict[str, Any]] = field(default_factory=list)
    admin_user: str = "root"
    calls: list[str] = field(default_factory=list)

    def list_jobs(self, *, updated_since: datetime | None = None) -> JobsListing:
        self.calls.append("jobs")
        return CODEC.decode_jobs({"jobs": self.listed})

    def accounting_job_records(self, *, job_id: int) -> list[AccountingRecord]:
        self.calls.append(f"accounting {job_id}")
        return CODEC.decode_accounting_jobs({"jobs": self.accounting})


def _running_job(*, slurm_job_id: int = 1, gpus: int = 1) -> Job:
    return make_job(
        name="numbered lines",
        gpus=gpus,
        gpu_type="h100",
        state=JobState.RUNNING,
        slurm_state="RUNNING",
        slurm_job_id=slurm_job_id,
        nodes="gpu01",
        submitted_at=_moment(SUBMITTED),
        started_at=_moment(STARTED),
    )


def _listed(job: Job, *, state: str, reason: str = "None", **times: Any) -> dict[str, Any]:
    """A job of GET /slurm/v0.0.38/jobs, with the fields the recorded one had."""
    body = {
        "job_id": job.slurm_job_id,
        "name": job.name,
        "account": job.project.slurm_account,
        "partition": "gpu",
        "user_name": "alice",
        "job_state": state,
        "state_reason": reason,
        "comment": job.slurm_comment,
        "restart_cnt": 0,
        "requeue": True,
        "batch_flag": True,
        "nodes": "gpu01",
        "submit_time": SUBMITTED,
        "start_time": STARTED,
        "end_time": STARTED + 300,
        "time_limit": 5,
        "exit_code": 0,
        "tres_req_str": f"cpu=1,mem=1000M,node=1,billing=1,gres/gpu={job.gpus},gres/gpu:h100={job.gpus}",
        "tres_alloc_str": f"cpu=1,mem=1000M,node=1,billing=1,gres/gpu={job.gpus},gres/gpu:h100={job.gpus}",
        "standard_output": "/tmp/matrix-logs/out",
        "standard_error": "/tmp/matrix-logs/err",
    }
    body.update(times)
    return body


def _requeued_listing(job: Job) -> dict[str, Any]:
    """How slurmctld listed the job three seconds after its node was set down."""
    return _listed(
        job,
        state="PENDING",
        reason="BeginTime",
        restart_cnt=1,
        nodes="",
        submit_time=NODE_DOWN,
        start_time=RESTARTED,
        end_time=RESTARTED + 300,
        tres_alloc_str="",
    )


def _accounting(job: Job, *, state: str, start: int, end: int, elapsed: int, comment: str | None) -> dict[str, Any]:
    """A job of GET /slurmdb/v0.0.38/job/{id}."""
    return {
        "job_id": job.slurm_job_id,
        "name": job.name,
        "account": job.project.slurm_account,
        "user": "alice",
        "partition": "gpu",
        "cluster": "matrixcluster",
        "state": {"current": state, "reason": "None"},
        "comment": {"administrator": None, "job": comment, "system": None},
        "time": {
            "submission": SUBMITTED if start == STARTED else NODE_DOWN,
            "start": start,
            "end": end,
            "elapsed": elapsed,
        },
        "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": job.gpus}]},
        "exit_code": {"status": "SUCCESS", "return_code": 0},
    }


def _cut_short_run(job: Job) -> dict[str, Any]:
    return _accounting(job, state="NODE_FAIL", start=STARTED, end=NODE_DOWN, elapsed=7, comment=job.slurm_comment)


def _timeline(job: Job) -> list[tuple[str, str, str]]:
    return list(job.transitions.values_list("from_state", "to_state", "detail"))


def test_a_running_job_slurm_requeues_after_its_node_failed_goes_back_to_pending_as_attempt_2() -> None:
    job = _running_job()
    pending_again = _accounting(job, state="PENDING", start=0, end=0, elapsed=0, comment=None)
    slurm = RecordedSlurm(listed=[_requeued_listing(job)], accounting=[_cut_short_run(job), pending_again])

    result = cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert (job.state, job.state_reason, job.nodes, job.ended_at) == (JobState.PENDING, "BeginTime", "", None)
    assert job.started_at == _moment(STARTED)
    assert _timeline(job) == [("running", "pending", "Requeued by Slurm after node gpu01 failed; attempt 2")]
    assert job.transitions.get().at == _moment(NODE_DOWN)
    assert (result.changed, slurm.calls) == (1, ["jobs", "accounting 1"])


def test_the_requeued_job_runs_again_and_completes_as_one_job() -> None:
    job = _running_job()
    slurm = RecordedSlurm(listed=[_requeued_listing(job)], accounting=[_cut_short_run(job)])
    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]
    again: dict[str, Any] = {"restart_cnt": 1, "nodes": "gpu02", "submit_time": NODE_DOWN, "start_time": RESTARTED}
    slurm.listed = [_listed(job, state="RUNNING", **again)]
    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]
    slurm.listed = [_listed(job, state="COMPLETED", **again, end_time=FINISHED)]
    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert (job.state, job.nodes, job.started_at, job.ended_at) == (
        JobState.COMPLETED,
        "gpu02",
        _moment(RESTARTED),
        _moment(FINISHED),
    )
    assert [(before, after) for before, after, _ in _timeline(job)] == [
        ("running", "pending"),
        ("pending", "running"),
        ("running", "completed"),
    ]
    assert slurm.calls.count("accounting 1") == 1  # the cause is looked up once, when the requeue is seen


def test_a_requeue_seen_only_once_the_next_attempt_runs_is_still_recorded() -> None:
    job = _running_job()
    again: dict[str, Any] = {"restart_cnt": 1, "nodes": "gpu02", "submit_time": NODE_DOWN, "start_time": RESTARTED}
    slurm = RecordedSlurm(listed=[_listed(job, state="RUNNING", **again)], accounting=[_cut_short_run(job)])

    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert (job.state, job.started_at) == (JobState.RUNNING, _moment(RESTARTED))
    assert _timeline(job) == [
        ("running", "pending", "Requeued by Slurm after node gpu01 failed; attempt 2"),
        ("pending", "running", "on gpu02"),
    ]


def test_when_accounting_cannot_say_why_the_requeue_is_recorded_in_plainer_words() -> None:
    job = _running_job()
    slurm = RecordedSlurm(listed=[_requeued_listing(job)], accounting=[])

    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert _timeline(job) == [
        ("running", "pending", "Requeued by Slurm after its run on gpu01 was cut short; attempt 2")
    ]


def test_a_job_slurm_does_not_requeue_ends_as_node_failure() -> None:
    job = _running_job(slurm_job_id=2, gpus=2)
    failed = _listed(job, state="NODE_FAIL", reason="NodeDown", end_time=NODE_DOWN, requeue=False)
    slurm = RecordedSlurm(listed=[failed])

    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert (job.state, job.get_state_display(), job.ended_at) == (
        JobState.NODE_FAIL,
        "Node failure",
        _moment(NODE_DOWN),
    )
    assert _timeline(job) == [
        (
            "running",
            "node_fail",
            "NODE_FAIL on gpu01 (NodeDown): Slurm lost the node while the job ran and did not requeue it",
        )
    ]
    assert slurm.calls == ["jobs"]


def test_a_requeued_job_slurmctld_forgot_is_finished_from_its_last_attempt_in_accounting() -> None:
    job = _running_job()
    last = _accounting(job, state="COMPLETED", start=RESTARTED, end=FINISHED, elapsed=60, comment=job.slurm_comment)
    slurm = RecordedSlurm(listed=[], accounting=[_cut_short_run(job), last])

    cluster_jobs_sync(cluster=job.cluster, client=slurm)  # type: ignore[arg-type]

    job.refresh_from_db()
    assert (job.state, job.started_at, job.ended_at) == (JobState.COMPLETED, _moment(RESTARTED), _moment(FINISHED))
    assert [detail for _, _, detail in _timeline(job)] == [
        "Requeued by Slurm after node gpu01 failed",
        "",
        "COMPLETED, exit code 0",
    ]
