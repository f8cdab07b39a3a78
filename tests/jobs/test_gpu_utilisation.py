"""GPU utilisation per job and GPU, from DCGM-format series served by scripts/dcgm_replay.py (real H100 readings,
made-up placement) and scraped by a real Prometheus; idle jobs flagged and their owners told once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.efficiency import job_waste_for
from billing.rates import rate_create
from clusters.models import Cluster
from clusters.prometheus import gpu_readings
from clusters.slurm.types import AccountingRecord
from clusters.slurm.types import JobState as SlurmState
from jobs.gpu_utilisation import cluster_gpu_utilisation_collect, job_efficiency_from_accounting
from jobs.job_sync import jobs_deliver_queued
from jobs.models import Job, JobEfficiency, JobGpuUsage, JobState, JobTransition, ProjectEfficiencyPolicy
from tenants.models import Notification
from tests.conftest import SentTask, wait_until
from tests.factories import add_project_member, make_project, make_tenant, make_user
from tests.jobs.conftest import LiveProject
from tests.processes import dcgm_replay_running, prometheus_running

# The local cluster's nodes as the replay serves them: on every node GPU 0 and 2 replay the busy trace (99 %),
# 1 and 3 the idle one (0 %, 21,714 MiB held), the rest the starving loader.
NODES = ("gpu01:4:h100", "gpu02:4:h100", "gpu03:8:a100", "gpu04:8:a100")
TRACE_OF_INDEX = {0: "busy", 1: "idle", 2: "busy", 3: "idle"}
ASSIGNMENTS = [
    f"--assign={node.split(':')[0]}:{index}={trace}" for node in NODES for index, trace in TRACE_OF_INDEX.items()
]
IDLE_MEMORY_MIB = 21714  # tests/data/nvidia-h100/trace-idle.csv: what the open notebook held throughout
BUSY_PEAK_MEMORY_MIB = 1362  # trace-busy.csv's most
WINDOW_SECONDS = 5


@pytest.fixture(scope="module")
def dcgm_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The replay exporter for the local cluster's nodes, scraped every second by a Prometheus of its own; yields
    the Prometheus URL once a window's worth of readings of every GPU is in."""
    directory = tmp_path_factory.mktemp("dcgm")
    arguments = [f"--node={node}" for node in NODES] + ASSIGNMENTS
    with (
        dcgm_replay_running(*arguments, log=directory / "exporter.log") as exporter,
        prometheus_running(exporter, directory=directory) as url,
    ):
        wait_until(
            lambda: len(gpu_readings(url=url, window_seconds=1)) == 24,
            timeout_seconds=60,
            what="Prometheus scraping 24 GPUs",
        )
        yield url


@pytest.fixture
def short_window(settings: Any) -> None:
    settings.GPU_UTILISATION_INTERVAL_SECONDS = WINDOW_SECONDS


def _collect(cluster: Cluster, **kwargs: object) -> object:
    return cluster_gpu_utilisation_collect(cluster=Cluster.objects.get(pk=cluster.pk), **kwargs)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_real_slurm_jobs_gpus_get_their_own_readings(
    live_project: LiveProject, dcgm_prometheus: str, short_window: None, sent_tasks: list[SentTask]
) -> None:
    """A 2-GPU job on the live 22.05 cluster: the sync learns its devices from slurmrestd's gres_detail, and one
    collection (two queries) gives each of them the readings of that node and index, and no other."""
    reply = live_project.submit(name="two gpus", gpus=2, script="#!/bin/bash\nsleep 120\n")
    jobs_deliver_queued(job_id=uuid.UUID(str(reply["id"])))
    job = live_project.wait_for(reply["id"], lambda job: job.state == JobState.RUNNING and bool(job.gpu_indices))
    ((node, indices),) = job.gpu_indices.items()
    assert node in {"gpu01", "gpu02"}
    assert len(indices) == 2

    Cluster.objects.filter(pk=live_project.cluster.pk).update(dcgm_prometheus_url=dcgm_prometheus)
    assert job.started_at is not None
    # As a collection a minute into the job would count it: the window before it, on each GPU.
    result = _collect(live_project.cluster, now=job.started_at + timedelta(minutes=1))
    assert (result.queries, result.jobs, result.gpus_read) == (2, 1, 24)  # type: ignore[attr-defined]

    usages = {usage.gpu_index: usage for usage in JobGpuUsage.objects.filter(job=job)}
    assert set(usages) == set(indices)
    assert {usage.node for usage in usages.values()} == {node}
    for index, usage in usages.items():
        if TRACE_OF_INDEX[index] == "idle":
            assert (usage.last_utilisation_percent, usage.peak_memory_mib) == (0.0, IDLE_MEMORY_MIB)
            assert usage.idle_since is not None
        else:
            assert usage.last_utilisation_percent > 50
            assert usage.peak_memory_mib == BUSY_PEAK_MEMORY_MIB
            assert usage.idle_since is None
    efficiency = JobEfficiency.objects.get(job=job)
    assert efficiency.source == "dcgm"
    assert efficiency.observed_gpu_seconds == 2 * WINDOW_SECONDS


def _job(cluster: Cluster, gpu_indices: dict[str, list[int]], *, state: str = JobState.RUNNING) -> Job:
    """A job of a new project and user, as the sync leaves one running on these GPUs since an hour ago."""
    project = make_project(make_tenant())
    user = make_user()
    add_project_member(project, user)
    return Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username="alice",
        name="job",
        partition="h100",
        gpu_type="h100",
        gpus=sum(len(indices) for indices in gpu_indices.values()),
        time_limit_minutes=120,
        state=state,
        gpu_indices=gpu_indices,
        started_at=timezone.now() - timedelta(hours=1),
    )


@pytest.fixture
def dcgm_cluster(dcgm_prometheus: str, short_window: None) -> Cluster:
    """A cluster whose jobs are read from the replay: idle means under 10 % for 30 s."""
    return Cluster.objects.create(
        name=f"dcgm{uuid.uuid4().hex[:6]}",
        slurmrestd_url="http://127.0.0.1:9",
        jwt_key_file="/nonexistent",
        log_root="/tmp/dcgm-logs",
        dcgm_prometheus_url=dcgm_prometheus,
        idle_gpu_threshold_percent=10,
        idle_gpu_after_seconds=30,
    )


@pytest.mark.django_db
def test_readings_reach_the_right_job_and_gpu(dcgm_cluster: Cluster) -> None:
    busy = _job(dcgm_cluster, {"gpu02": [0]})
    idle = _job(dcgm_cluster, {"gpu02": [1]})
    half = _job(dcgm_cluster, {"gpu01": [2, 3]})
    unseen = _job(dcgm_cluster, {"gpu09": [0]})  # no series for this node
    ended = _job(dcgm_cluster, {"gpu01": [0]}, state=JobState.COMPLETED)

    result = _collect(dcgm_cluster)

    assert (result.queries, result.jobs) == (2, 4)  # type: ignore[attr-defined]
    readings = {
        (usage.job_id, usage.node, usage.gpu_index): (usage.last_utilisation_percent > 50, usage.last_memory_mib)
        for usage in JobGpuUsage.objects.all()
    }
    assert readings == {
        (busy.pk, "gpu02", 0): (True, BUSY_PEAK_MEMORY_MIB),
        (idle.pk, "gpu02", 1): (False, IDLE_MEMORY_MIB),
        (half.pk, "gpu01", 2): (True, BUSY_PEAK_MEMORY_MIB),
        (half.pk, "gpu01", 3): (False, IDLE_MEMORY_MIB),
    }
    assert not JobEfficiency.objects.filter(job__in=[unseen, ended]).exists()
    half_efficiency = JobEfficiency.objects.get(job=half)
    assert (half_efficiency.idle_gpus, half_efficiency.idle_gpu_seconds) == (1, WINDOW_SECONDS)
    assert half_efficiency.peak_memory_mib == IDLE_MEMORY_MIB


@pytest.mark.django_db
def test_an_idle_job_is_flagged_once_its_limit_passes_and_its_owner_told_once(dcgm_cluster: Cluster) -> None:
    idle = _job(dcgm_cluster, {"gpu02": [1]})
    busy = _job(dcgm_cluster, {"gpu02": [0]})
    manager = make_user()
    add_project_member(idle.project, manager, "manager")
    ProjectEfficiencyPolicy.objects.create(project=idle.project, notify_managers=True)
    start = timezone.now()

    _collect(dcgm_cluster, now=start)  # idle since start - 5 s: 5 s of the 30 s limit
    assert JobEfficiency.objects.get(job=idle).flagged_at is None
    assert not Notification.objects.exists()

    moments = [start + timedelta(seconds=seconds) for seconds in (5, 10, 15, 20, 25, 30, 35)]
    for moment in moments:
        _collect(dcgm_cluster, now=moment)

    efficiency = JobEfficiency.objects.get(job=idle)
    # Idle from start - 5 s; the reading at start + 25 s is the first with 30 s behind it.
    assert efficiency.flagged_at == start + timedelta(seconds=25)
    # Marked changed as it was flagged: an open job page reloads its facts on the push and shows the flag.
    assert Job.objects.get(pk=idle.pk).updated_at == start + timedelta(seconds=25)
    assert efficiency.idle_gpu_seconds == 40
    # Priced at the job's rate: 40 idle GPU-seconds x 3.60 per GPU-hour = 0.04, exactly.
    rate_create(
        actor=None,
        cluster=dcgm_cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("3.60"),
        currency="EUR",
        valid_from=start - timedelta(days=1),
    )
    waste = job_waste_for(Job.objects.get(pk=idle.pk))
    assert waste is not None
    assert waste.idle_cost == Decimal(40) * Decimal("3.60") / 3600 == Decimal("0.04")
    assert JobEfficiency.objects.get(job=busy).flagged_at is None
    notices = list(Notification.objects.order_by("user_id").values_list("user_id", "kind", "link"))
    assert notices == sorted(
        [(idle.user_id, "job.gpu_idle", f"/jobs/{idle.pk}/"), (manager.pk, "job.gpu_idle", f"/jobs/{idle.pk}/")]
    )


@pytest.mark.django_db
def test_the_manager_is_told_only_where_the_project_asks(dcgm_cluster: Cluster) -> None:
    idle = _job(dcgm_cluster, {"gpu03": [1]})
    add_project_member(idle.project, make_user(), "manager")
    start = timezone.now()
    for seconds in range(0, 45, 5):
        _collect(dcgm_cluster, now=start + timedelta(seconds=seconds))
    assert list(Notification.objects.values_list("user_id", flat=True)) == [idle.user_id]


@pytest.mark.django_db
def test_an_opted_in_projects_idle_job_is_warned_then_ended_and_an_active_one_never_touched(
    dcgm_cluster: Cluster, sent_tasks: list[SentTask], django_capture_on_commit_callbacks: Any
) -> None:
    idle = _job(dcgm_cluster, {"gpu04": [1, 3]})  # both GPUs idle
    half = _job(dcgm_cluster, {"gpu04": [2, 5]})  # one busy, one idle: at work
    busy = _job(dcgm_cluster, {"gpu04": [0]})
    for job in (idle, half, busy):
        ProjectEfficiencyPolicy.objects.create(
            project=job.project, end_idle_jobs=True, end_after_idle_seconds=60, warning_seconds=20
        )
    start = timezone.now()

    def collect_until(seconds: int) -> None:
        for moment in range(collect_until.done, seconds + 1, 5):  # type: ignore[attr-defined]
            with django_capture_on_commit_callbacks(execute=True):  # the tasks a commit would send
                _collect(dcgm_cluster, now=start + timedelta(seconds=moment))
        collect_until.done = seconds + 5  # type: ignore[attr-defined]

    collect_until.done = 0  # type: ignore[attr-defined]
    collect_until(30)  # idle since start - 5 s: 35 s of the 60, not yet the 40 that warns
    assert not JobTransition.objects.exists()

    collect_until(35)
    (warning,) = JobTransition.objects.all()
    assert warning.job_id == idle.pk
    assert warning.detail.startswith("Warned: 2 of its 2 GPU(s) on")
    assert f"so this one ends at {start + timedelta(seconds=55):%Y-%m-%d %H:%M} UTC" in warning.detail
    assert Notification.objects.filter(user=idle.user, kind="job.gpu_idle_warning").count() == 1
    assert sent_tasks == []

    collect_until(50)
    assert Job.objects.get(pk=idle.pk).cancel_requested_at is None

    collect_until(55)
    ended = Job.objects.get(pk=idle.pk)
    assert ended.cancel_requested_at == start + timedelta(seconds=55)
    # No user asked: its page and API say the portal cancelled it, and why.
    assert ended.cancelled_by == "the portal"
    assert ended.cancel_reason.startswith("Ended by the project's idle-GPU policy: 2 of its 2 GPU(s)")
    assert [transition.detail.split(":")[0] for transition in ended.transitions.all()] == [
        "Warned",
        "Ended by the project's idle-GPU policy",
    ]
    assert sent_tasks == [("jobs.tasks.job_cancel", (str(idle.pk),))]
    assert JobEfficiency.objects.get(job=idle).ended_at == start + timedelta(seconds=55)

    collect_until(120)  # long after: the ended job is not ended twice, the working ones never touched
    assert sent_tasks == [("jobs.tasks.job_cancel", (str(idle.pk),))]
    for job in (half, busy):
        assert Job.objects.get(pk=job.pk).cancel_requested_at is None
        assert not JobTransition.objects.filter(job=job).exists()
        assert JobEfficiency.objects.get(job=job).warned_at is None
    assert JobEfficiency.objects.get(job=half).flagged_at is not None  # flagged (a GPU idles), never ended


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("slurm_gpu_accounting", "utilisation", "expected"),
    [
        # A mean under the threshold: every GPU-second of the job counts as idle.
        (True, 4.0, ("slurm", 7200, 7200, 4.0, 21714)),
        (True, 61.0, ("slurm", 7200, 0, 61.0, 21714)),
        (False, 4.0, None),  # the cluster does not record it: nothing is taken
        (True, None, None),  # recorded nothing for this job
    ],
)
def test_a_finished_jobs_figure_from_slurm_accounting(
    slurm_gpu_accounting: bool, utilisation: float | None, expected: tuple[object, ...] | None
) -> None:
    cluster = Cluster.objects.create(
        name=f"acct{uuid.uuid4().hex[:6]}",
        slurmrestd_url="http://127.0.0.1:9",
        jwt_key_file="/nonexistent",
        log_root="/tmp/acct-logs",
        slurm_gpu_accounting=slurm_gpu_accounting,
    )
    job = _job(cluster, {}, state=JobState.COMPLETED)
    record = AccountingRecord(
        job_id=42, name="job", account="a", user_name="alice", partition="h100", cluster=cluster.name,
        state=SlurmState.COMPLETED, comment="", submit_time=None, start_time=None, end_time=None,
        elapsed_seconds=3600, gpus_allocated=2, gpu_type="h100", exit_code=0,
        gpu_utilisation_percent=utilisation, gpu_memory_peak_bytes=21714 * 1024 * 1024,
    )  # fmt: skip

    written = job_efficiency_from_accounting(job=job, cluster=cluster, record=record, gpu_seconds=record.gpu_seconds)

    assert written is (expected is not None)
    efficiency = JobEfficiency.objects.filter(job=job).first()
    figures = efficiency and (
        efficiency.source,
        efficiency.observed_gpu_seconds,
        efficiency.idle_gpu_seconds,
        efficiency.mean_utilisation_percent,
        efficiency.peak_memory_mib,
    )
    assert figures == expected
