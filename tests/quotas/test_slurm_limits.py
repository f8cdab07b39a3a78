"""The GPU-minute limit in Slurm on the live cluster: written from the allocations, enforced on jobs that bypass
the portal, repaired when changed behind the portal's back, and moved on at a period rollover."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.accounts import cluster_slurm_reconcile
from clusters.models import SlurmDriftKind
from clusters.slurm import SlurmClient
from clusters.slurm.types import JobState, JobSubmission, SlurmJob
from jobs.job_services import JobRequest, job_submit
from jobs.job_sync import job_deliver
from jobs.models import Job
from quotas.models import Allocation, LedgerEntry, LedgerKind, QuotaLimitState
from quotas.services import allocation_grant, quota_charge
from quotas.slurm_limits import ACCOUNTING_BEGINNING, LimitOutcome, quota_limit_sync, quota_limits_sync_all
from tests.conftest import wait_for_job
from tests.factories import grant_allocation, make_project, make_tenant, make_user
from tests.jobs.conftest import LiveProject, _live_project, local_cluster

pytestmark = pytest.mark.django_db

QUOTA_REASON = "AssocGrpGRESMinutes"


@pytest.fixture
def quota_project(slurm_client: SlurmClient) -> Iterator[LiveProject]:
    """Like `live_project` (alice member, bob manager, the account in Slurm), but with no allocation: each
    test grants the hours and periods it needs. Its jobs are cancelled and the account removed afterwards."""
    yield from _live_project(local_cluster(), slurm_client, with_allocation=False)


@pytest.fixture
def slurm_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request any Slurm client sends from now on, as 'METHOD path'."""
    sent: list[str] = []
    original = SlurmClient._send

    def counting(self: SlurmClient, method: str, path: str, **kwargs: Any) -> Any:
        sent.append(f"{method} {path}")
        return original(self, method, path, **kwargs)

    monkeypatch.setattr(SlurmClient, "_send", counting)
    return sent


def _limit(client: SlurmClient, project: LiveProject) -> int | None:
    return client.account_gpu_minutes_limit(account=project.project.slurm_account, cluster="local")


def _submit_bypassing_the_portal(
    client: SlurmClient, project: LiveProject, directory: Path, *, gpus: int, minutes: int, script: str
) -> int:
    name = uuid.uuid4().hex[:8]
    submitted = client.submit_job(
        user="alice",
        submission=JobSubmission(
            name=f"bypass-{name}",
            account=project.project.slurm_account,
            partition="a100",
            script=script,
            time_limit_minutes=minutes,
            working_directory=str(directory),
            standard_output=str(directory / f"{name}.out"),
            standard_error=str(directory / f"{name}.err"),
            gpus=gpus,
        ),
    )
    return submitted.job_id


def _started_or_held_by_quota(job: SlurmJob) -> bool:
    return job.state is not JobState.PENDING or job.state_reason == QUOTA_REASON


def _cancel(client: SlurmClient, *job_ids: int) -> None:
    for job_id in job_ids:
        if not client.get_job(job_id=job_id).state.is_finished:
            client.cancel_job(user="alice", job_id=job_id)


def _accounting_usage(client: SlurmClient, *, account: str, slurm_job_id: int) -> Callable[[], int | None]:
    """The job's GPU-seconds once Slurm's accounting lists it, ended, under the account (as the opening
    measurement and the charge collector read it)."""

    def usage() -> int | None:
        for record in client.accounting_jobs(account=account, start_time=ACCOUNTING_BEGINNING):
            if record.job_id == slurm_job_id and record.state.is_finished and record.end_time:
                return record.gpu_seconds
        return None

    return usage


def _poll(read: Callable[[], int | None], *, timeout_seconds: float = 30) -> int:
    deadline = time.monotonic() + timeout_seconds
    while (value := read()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"nothing recorded within {timeout_seconds}s")
        time.sleep(0.25)
    return value


# Writing the limit ---------------------------------------------------------------------------------------


def test_a_new_account_without_allocations_gets_no_gpu_minutes(
    quota_project: LiveProject, slurm_client: SlurmClient
) -> None:
    state = QuotaLimitState.objects.get(project=quota_project.project, cluster=quota_project.cluster)

    assert _limit(slurm_client, quota_project) == 0
    assert (state.opening_gpu_seconds, state.opening_measured, state.applied_minutes) == (0, True, 0)
    assert state.applied_at is not None
    assert state.last_error == ""


def test_an_allocation_is_written_as_the_exact_limit(quota_project: LiveProject, slurm_client: SlurmClient) -> None:
    grant_allocation(quota_project.project, quota_project.cluster, gpu_hours="12.5")

    result = quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)

    assert (result.outcome, result.expected_minutes) == (LimitOutcome.WRITTEN, 750)
    assert _limit(slurm_client, quota_project) == 750
    state = QuotaLimitState.objects.get(project=quota_project.project, cluster=quota_project.cluster)
    assert (state.applied_minutes, state.last_error) == (750, "")
    # The account was put back under its tenant's parent account after the limit was written.
    association = slurm_client.associations(account=quota_project.project.slurm_account, cluster="local")
    assert {a.parent_account for a in association if not a.user} == {quota_project.project.tenant.slurm_parent_account}


def test_a_project_whose_account_does_not_exist_yet_is_skipped(slurm_requests: list[str]) -> None:
    cluster = local_cluster()
    project = make_project(make_tenant())  # no sync has created its account
    grant_allocation(project, cluster, gpu_hours=1)
    slurm_requests.clear()

    result = quota_limit_sync(project_id=project.pk, cluster_id=cluster.pk)

    assert result.outcome == LimitOutcome.NO_ACCOUNT
    assert slurm_requests == []
    state = QuotaLimitState.objects.get(project=project, cluster=cluster)
    assert (state.applied_minutes, state.applied_at, state.last_error) == (None, None, "")


def test_usage_from_before_the_portal_tracked_the_account_is_measured_once_and_kept_in_the_limit(
    quota_project: LiveProject, slurm_client: SlurmClient, job_directory: Path, slurm_requests: list[str]
) -> None:
    # An account that ran a job before the portal tracked its limit (an existing deployment taking up quotas).
    account = quota_project.project.slurm_account
    slurm_client.set_account_gpu_minutes_limit(account=account, cluster="local", minutes=100)
    earlier = _submit_bypassing_the_portal(
        slurm_client, quota_project, job_directory, gpus=2, minutes=1, script="#!/bin/bash\nsleep 1\n"
    )
    used = _poll(_accounting_usage(slurm_client, account=account, slurm_job_id=earlier))
    QuotaLimitState.objects.filter(project=quota_project.project).delete()
    grant_allocation(quota_project.project, quota_project.cluster, gpu_hours=1)
    slurm_requests.clear()

    quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)

    state = QuotaLimitState.objects.get(project=quota_project.project, cluster=quota_project.cluster)
    assert (state.opening_gpu_seconds, state.opening_measured) == (used, True)
    assert 0 < used < 60
    assert _limit(slurm_client, quota_project) == (used + 3600) // 60 == 60
    assert sum(1 for request in slurm_requests if "/jobs" in request) == 1  # one accounting query
    slurm_requests.clear()
    quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)
    assert not any("/jobs" in request for request in slurm_requests)  # measured once


# Enforcement without the portal ---------------------------------------------------------------------------


def test_slurm_holds_a_job_submitted_around_the_portal_once_the_allocation_is_taken(
    quota_project: LiveProject, slurm_client: SlurmClient, job_directory: Path
) -> None:
    grant_allocation(quota_project.project, quota_project.cluster, gpu_hours="0.1")  # 6 GPU-minutes
    quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)
    assert _limit(slurm_client, quota_project) == 6

    # 2 GPUs x 2 min = 4 GPU-minutes: fits, and holds them while it runs.
    first = _submit_bypassing_the_portal(
        slurm_client, quota_project, job_directory, gpus=2, minutes=2, script="#!/bin/bash\nsleep 60\n"
    )
    # Another 4 do not fit in the 2 left.
    second = _submit_bypassing_the_portal(
        slurm_client, quota_project, job_directory, gpus=2, minutes=2, script="#!/bin/bash\nsleep 1\n"
    )
    try:
        running = wait_for_job(slurm_client, first, _started_or_held_by_quota)
        held = wait_for_job(slurm_client, second, _started_or_held_by_quota)

        assert running.state is JobState.RUNNING
        assert (held.state, held.state_reason) == (JobState.PENDING, QUOTA_REASON)
    finally:
        _cancel(slurm_client, second, first)


# Drift ----------------------------------------------------------------------------------------------------


def test_a_limit_changed_behind_the_portals_back_is_reported_and_repaired(
    quota_project: LiveProject, slurm_client: SlurmClient
) -> None:
    grant_allocation(quota_project.project, quota_project.cluster, gpu_hours=10)
    quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)
    account = quota_project.project.slurm_account
    slurm_client.set_account_gpu_minutes_limit(account=account, cluster="local", minutes=5)

    report = cluster_slurm_reconcile(cluster_id=quota_project.cluster.pk)

    label = f"{quota_project.project.tenant.slug}/{quota_project.project.slug}"
    finding = {
        "kind": SlurmDriftKind.GPU_LIMIT.value,
        "account": account,
        "user": "",
        "detail": f"Slurm has GrpTRESMins=gres/gpu=5 on {account}, the allocations of {label} say 600.",
        "repaired": True,
    }
    assert report.error == ""
    assert report.findings == [finding]
    assert _limit(slurm_client, quota_project) == 600
    state = QuotaLimitState.objects.get(project=quota_project.project, cluster=quota_project.cluster)
    assert (state.applied_minutes, state.last_error) == (600, "")

    admin = APIClient()
    admin.force_authenticate(make_user(is_staff=True))
    listed = admin.get("/api/v1/slurm-drift-reports/?cluster=local").json()
    assert listed["results"][0]["id"] == report.pk
    assert listed["results"][0]["findings"] == [finding]

    # In line again: the next run finds nothing.
    assert cluster_slurm_reconcile(cluster_id=quota_project.cluster.pk).findings == []


# Period rollover --------------------------------------------------------------------------------------------


def _run_through_the_portal(project: LiveProject, *, gpus: int, deliver: bool) -> Job:
    with transaction.atomic():
        job, _ = job_submit(
            user=project.member,
            project=project.project,
            request=JobRequest(
                cluster="local",
                partition="h100",
                gpus=gpus,
                gpu_type="h100",
                time_limit_minutes=1,
                script="#!/bin/bash\nsleep 1\n",
            ),
        )
    if deliver:
        assert job_deliver(job_id=job.pk).outcome == "submitted"
    return job


def test_at_a_period_rollover_the_limit_moves_to_the_new_grant_and_open_reservations_follow(
    quota_project: LiveProject, slurm_client: SlurmClient, job_directory: Path
) -> None:
    today = timezone.now().date()
    period_a = grant_allocation(
        quota_project.project,
        quota_project.cluster,
        gpu_hours="0.1",  # 360 GPU-seconds
        starts_on=today - timedelta(days=10),
        ends_on=today,
    )
    period_b = grant_allocation(
        quota_project.project,
        quota_project.cluster,
        gpu_hours="0.2",  # 720 GPU-seconds
        starts_on=today + timedelta(days=1),
        ends_on=today + timedelta(days=30),
    )
    quota_limit_sync(project_id=quota_project.project.pk, cluster_id=quota_project.cluster.pk)
    assert _limit(slurm_client, quota_project) == 6

    # A job runs and is charged to A; another is admitted (reserving 60 GPU-seconds on A) and not yet run.
    ran = _run_through_the_portal(quota_project, gpus=2, deliver=True)
    waiting = _run_through_the_portal(quota_project, gpus=1, deliver=False)
    quota_project.wait_for(ran.pk, lambda job: job.is_final)
    ran.refresh_from_db()
    used = _poll(
        _accounting_usage(slurm_client, account=quota_project.project.slurm_account, slurm_job_id=ran.slurm_job_id or 0)
    )
    quota_charge(job=ran, gpu_seconds=used, now=timezone.now(), note="test")
    charged = LedgerEntry.objects.get(job=ran, kind=LedgerKind.CHARGE)
    assert charged.allocation_id == period_a.pk
    assert 0 < charged.gpu_seconds < 60  # 2 GPUs for about a second

    just_after_midnight = datetime.combine(today + timedelta(days=1), clock(0, 0, 30), tzinfo=UTC)
    summary = quota_limits_sync_all(now=just_after_midnight)

    # The open reservation moved from A to B.
    assert summary.carried_over == 1
    moves = LedgerEntry.objects.filter(job=waiting).order_by("id")
    assert [(entry.kind, entry.allocation_id, entry.gpu_seconds) for entry in moves] == [
        (LedgerKind.RESERVE, period_a.pk, 60),
        (LedgerKind.RELEASE, period_a.pk, 60),
        (LedgerKind.RESERVE, period_b.pk, 60),
    ]
    period_a.refresh_from_db()
    period_b.refresh_from_db()
    assert (period_a.reserved_gpu_seconds, period_a.charged_gpu_seconds) == (0, charged.gpu_seconds)
    assert (period_b.reserved_gpu_seconds, period_b.charged_gpu_seconds) == (60, 0)
    # Slurm's limit: what was used before B, plus B's grant.
    assert [result.outcome for result in summary.results] == [LimitOutcome.WRITTEN]
    assert _limit(slurm_client, quota_project) == (charged.gpu_seconds + 720) // 60 == 12

    # 4 GPUs x 2 min = 8 GPU-minutes: more than A had left (6 minus what ran), within B's 12.
    fits_b = _submit_bypassing_the_portal(
        slurm_client, quota_project, job_directory, gpus=4, minutes=2, script="#!/bin/bash\nsleep 1\n"
    )
    try:
        started = wait_for_job(slurm_client, fits_b, _started_or_held_by_quota)
        assert started.state in {JobState.RUNNING, JobState.COMPLETED}, started.state_reason
    finally:
        _cancel(slurm_client, fits_b)


def test_a_second_run_with_nothing_changed_sends_no_request_to_slurm(
    quota_project: LiveProject, slurm_client: SlurmClient, slurm_requests: list[str]
) -> None:
    allocation = grant_allocation(quota_project.project, quota_project.cluster, gpu_hours=2)
    first = quota_limits_sync_all()
    assert [(result.outcome, result.expected_minutes) for result in first.results] == [(LimitOutcome.WRITTEN, 120)]
    applied_at = QuotaLimitState.objects.get(project=quota_project.project).applied_at
    slurm_requests.clear()

    second = quota_limits_sync_all()

    assert (second.checked, second.results) == (1, [])
    assert slurm_requests == []
    assert QuotaLimitState.objects.get(project=quota_project.project).applied_at == applied_at

    # A grant changes the expected limit: the next run writes it.
    allocation_grant(actor=None, allocation=allocation, gpu_seconds=3600, note="more")
    third = quota_limits_sync_all()
    assert [(result.outcome, result.expected_minutes) for result in third.results] == [(LimitOutcome.WRITTEN, 180)]
    assert _limit(slurm_client, quota_project) == 180
    assert Allocation.objects.get(pk=allocation.pk).granted_gpu_seconds == 3 * 3600
