"""Reconciliation reports: the portal's usage of a period compared with Slurm's accounting on the real cluster,
job by job; portal admins request and read them through the API and the admin, nobody else sees any."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

import billing.reconciliation_admin  # noqa: F401  (registers the admin until billing/admin.py imports it)
from billing import reconciliation
from billing.models import ReconciliationReport, ReconciliationState, UsageRecord
from billing.rates import rate_create
from billing.reconciliation import reconciliation_report_run
from billing.usage import usage_import
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ProjectSlurmAccount
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import AccountingRecord, JobSubmission
from jobs.models import Job, JobState
from jobs.quota_usage import quota_usage_collect
from quotas.models import LedgerEntry, LedgerKind
from quotas.services import quota_charge
from quotas.units import gpu_seconds_to_hours
from tenants.models import AuditEvent
from tests.conftest import SentArguments, SentTask, is_finished, wait_for_job, wait_until
from tests.factories import PASSWORD, add_project_member, make_matrix_cluster, make_project, make_tenant, make_user
from tests.jobs.conftest import LiveProject

pytestmark = pytest.mark.django_db(transaction=True)

# Far above any id the local cluster hands out (Slurm's MaxJobId defaults to 67,043,328).
GHOST_SLURM_JOB_ID = 67_100_000


@pytest.fixture
def enqueued(sent_tasks: list[SentTask]) -> SentArguments:
    """The report ids handed to the worker, instead of the broker: tests run the task function themselves."""
    return SentArguments(sent_tasks, "billing.tasks.reconciliation_report_run")


def _api(user: User | None) -> APIClient:
    api = APIClient()
    if user is not None:
        api.force_authenticate(user)
    return api


def _moment(moment: datetime | None) -> str:
    assert moment is not None
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


# The live comparison ------------------------------------------------------------------------------------


def _record(client: SlurmClient, slurm_job_id: int, is_own: Callable[[AccountingRecord], bool]) -> AccountingRecord:
    """The job's finished record, once slurmdbd has it (it lags slurmctld a little)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            record: AccountingRecord | None = client.accounting_job(job_id=slurm_job_id)
        except SlurmError:
            record = None
        if record is not None and record.state.is_finished and is_own(record):
            return record
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm job {slurm_job_id} has no finished accounting record of its own after 30 s: {record}")
        time.sleep(0.25)


def _outside(live_project: LiveProject, job_directory: Path, name: str) -> JobSubmission:
    return JobSubmission(
        name=name,
        account=live_project.project.slurm_account,
        partition="h100",
        script="#!/bin/bash\nsleep 1\n",
        time_limit_minutes=1,
        working_directory=str(job_directory),
        standard_output=str(job_directory / f"{name}.out"),
        standard_error=str(job_directory / f"{name}.err"),
        gpus=1,
        gpu_type="h100",
        environment={"PATH": "/usr/bin:/bin"},
    )


def _collect_until_charged(cluster: Cluster, jobs: list[Job]) -> None:
    """Collect as the periodic sync does until every job is charged: slurmdbd may take a moment."""
    deadline = time.monotonic() + 60
    while LedgerEntry.objects.filter(job__in=jobs, kind=LedgerKind.CHARGE).count() < len(jobs):
        if time.monotonic() > deadline:
            pytest.fail("the jobs were not all charged within 60 s")
        quota_usage_collect(cluster=Cluster.objects.get(pk=cluster.pk), client=slurm_client_for(cluster))
        time.sleep(1)


def test_a_report_finds_every_disagreement_between_the_portal_and_slurms_accounting(
    live_project: LiveProject,
    slurm_client: SlurmClient,
    job_directory: Path,
    celery_worker: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = live_project.cluster
    project = live_project.project
    account = project.slurm_account
    period_start = timezone.now() - timedelta(seconds=2)
    # h100 GPUs have a price; a100 GPUs none, so a job on them stays unpriced.
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("2.5"),
        currency="EUR",
        valid_from=period_start - timedelta(hours=1),
    )

    # Through the portal: one priced, one on GPUs without a rate.
    script = "#!/bin/bash\nsleep 1\n"
    priced_reply = live_project.submit(name="priced", script=script, time_limit_minutes=1)
    unpriced_reply = live_project.submit(
        name="unpriced", partition="a100", gpu_type="a100", script=script, time_limit_minutes=1
    )
    priced = live_project.wait_for(priced_reply["id"], lambda job: job.is_final, timeout=120)
    unpriced = live_project.wait_for(unpriced_reply["id"], lambda job: job.is_final, timeout=120)
    assert (priced.state, unpriced.state) == (JobState.COMPLETED, JobState.COMPLETED)

    # Around the portal, found by the sync.
    seen_id = slurm_client.submit_job(user="alice", submission=_outside(live_project, job_directory, "seen")).job_id

    def found() -> bool:
        live_project.sync()
        return Job.objects.filter(cluster=cluster, is_external=True, slurm_job_id=seen_id).exists()

    wait_until(found, timeout_seconds=60, what="the sync finding the external job")
    seen = live_project.wait_for(
        Job.objects.get(cluster=cluster, is_external=True, slurm_job_id=seen_id).pk, lambda job: job.is_final
    )

    _collect_until_charged(cluster, [priced, unpriced, seen])
    imported = usage_import()
    assert (imported.imported, imported.unpriced) == (2, 1)

    # Around the portal, never synced: the portal does not know it.
    unseen_id = slurm_client.submit_job(user="alice", submission=_outside(live_project, job_directory, "unseen")).job_id
    wait_for_job(slurm_client, unseen_id, is_finished, timeout_seconds=120)

    # Known to the portal only: a job Slurm never had.
    ghost_end = timezone.now() - timedelta(seconds=1)
    ghost = Job.objects.create(
        project=project,
        cluster=cluster,
        user=live_project.member,
        cluster_username="alice",
        name="ghost",
        partition="h100",
        gpu_type="h100",
        gpus=1,
        time_limit_minutes=1,
        state=JobState.COMPLETED,
        slurm_job_id=GHOST_SLURM_JOB_ID,
        submitted_at=ghost_end - timedelta(seconds=20),
        started_at=ghost_end - timedelta(seconds=20),
        ended_at=ghost_end,
    )
    assert quota_charge(job=ghost, gpu_seconds=20, now=ghost_end, note="made up")

    # A usage record that drifted from the charge it was made from.
    UsageRecord.objects.filter(job=seen).update(gpu_seconds=F("gpu_seconds") + 7)

    records = {
        "priced": _record(slurm_client, priced.slurm_job_id or 0, lambda r: r.comment == priced.slurm_comment),
        "unpriced": _record(slurm_client, unpriced.slurm_job_id or 0, lambda r: r.comment == unpriced.slurm_comment),
        "seen": _record(slurm_client, seen_id, lambda r: r.submit_time == seen.slurm_submit_time),
        "unseen": _record(slurm_client, unseen_id, lambda r: r.account == account),
    }
    used = {name: record.gpu_seconds for name, record in records.items()}
    assert all(record.gpus_allocated == 1 for record in records.values())
    period_end = timezone.now()
    # slurmdbd 22.05's window query has, rarely, left out a record that the by-id lookup already returned; a
    # report covers a period that ended a while ago, so wait as long as it takes the window to show this one.
    wait_until(
        lambda: (
            unseen_id
            in {found.job_id for found in slurm_client.accounting_jobs(account=account, start_time=period_start)}
        ),
        what="the window query returning the unseen job",
    )
    report = ReconciliationReport.objects.create(cluster=cluster, period_start=period_start, period_end=period_end)

    done = reconciliation_report_run(report_id=report.pk)

    assert (done.state, done.error) == (ReconciliationState.DONE, "")
    assert done.started_at is not None
    assert done.finished_at is not None
    unseen, seen_record, unpriced_record = records["unseen"], records["seen"], records["unpriced"]
    assert done.findings == [
        {
            "kind": "missing_in_slurm",
            "slurm_job_id": GHOST_SLURM_JOB_ID,
            "account": account,
            "job": str(ghost.pk),
            "portal_gpu_seconds": 20,
            "slurm_gpu_seconds": None,
            "detail": (
                f"The portal's job 'ghost' ran with 1 GPU(s) as Slurm job {GHOST_SLURM_JOB_ID} and ended "
                f"{_moment(ghost_end)}, but Slurm's accounting has no finished record of it in account {account}; "
                "the portal counts 20 GPU-seconds for it."
            ),
        },
        {
            "kind": "missing_in_portal",
            "slurm_job_id": unseen_id,
            "account": account,
            "job": None,
            "portal_gpu_seconds": None,
            "slurm_gpu_seconds": used["unseen"],
            "detail": (
                f"Slurm's accounting has job {unseen_id} ('unseen' of user alice) in account {account}, ended "
                f"{_moment(unseen.end_time)}, {unseen.elapsed_seconds} s x 1 GPU, and no portal job matches it: the "
                "portal neither tracked nor charged it."
            ),
        },
        {
            "kind": "gpu_seconds_differ",
            "slurm_job_id": seen_id,
            "account": account,
            "job": str(seen.pk),
            "portal_gpu_seconds": used["seen"] + 7,
            "slurm_gpu_seconds": used["seen"],
            "detail": (
                f"The portal counts {used['seen'] + 7} GPU-seconds (its usage record) and Slurm's accounting "
                f"{used['seen']} ({seen_record.elapsed_seconds} s x 1 GPU): the portal is off by +7 GPU-seconds."
            ),
        },
        {
            "kind": "unpriced",
            "slurm_job_id": unpriced.slurm_job_id,
            "account": account,
            "job": str(unpriced.pk),
            "portal_gpu_seconds": used["unpriced"],
            "slurm_gpu_seconds": used["unpriced"],
            "detail": (
                f"Slurm's accounting has {used['unpriced']} GPU-seconds ({unpriced_record.elapsed_seconds} s x 1 GPU); "
                "the job is charged but not priced yet: no rate was in force when it ran, or the usage import has "
                "not run since."
            ),
        },
    ]
    portal_total = used["priced"] + used["unpriced"] + used["seen"] + 7 + 20
    slurm_total = used["priced"] + used["unpriced"] + used["seen"] + used["unseen"]
    assert done.summary == {
        "accounts": 1,
        "portal_jobs": 4,
        "slurm_jobs": 4,
        "jobs_compared": 3,
        "counts": {"missing_in_slurm": 1, "missing_in_portal": 1, "gpu_seconds_differ": 1, "unpriced": 1},
        "portal_gpu_seconds": portal_total,
        "slurm_gpu_seconds": slurm_total,
        "difference_gpu_seconds": portal_total - slurm_total,
        "portal_gpu_hours": str(gpu_seconds_to_hours(portal_total)),
        "slurm_gpu_hours": str(gpu_seconds_to_hours(slurm_total)),
        "difference_gpu_hours": str(gpu_seconds_to_hours(portal_total - slurm_total)),
        "findings_total": 4,
        "findings_stored": 4,
        "findings_truncated": False,
    }

    # A second delivery of the task leaves the done report as it is.
    ReconciliationReport.objects.filter(pk=report.pk).update(findings=[])
    assert reconciliation_report_run(report_id=report.pk).findings == []

    # A report keeps at most MAX_FINDINGS findings; its summary still counts them all.
    monkeypatch.setattr(reconciliation, "MAX_FINDINGS", 2)
    capped = ReconciliationReport.objects.create(cluster=cluster, period_start=period_start, period_end=period_end)
    capped = reconciliation_report_run(report_id=capped.pk)
    assert capped.findings == done.findings[:2]
    assert capped.summary == {**done.summary, "findings_stored": 2, "findings_truncated": True}

    # A period before these jobs finds nothing on either side.
    earlier = ReconciliationReport.objects.create(
        cluster=cluster, period_start=period_start - timedelta(hours=1), period_end=period_start
    )
    nothing = reconciliation_report_run(report_id=earlier.pk)
    assert (nothing.state, nothing.findings) == (ReconciliationState.DONE, [])
    assert (nothing.summary["portal_jobs"], nothing.summary["slurm_jobs"]) == (0, 0)


# Failures and idempotence, without the live cluster -------------------------------------------------------


def _unreachable_cluster() -> Cluster:
    """A cluster whose slurmrestd does not answer, with one project account to ask about."""
    cluster = make_matrix_cluster()
    Cluster.objects.filter(pk=cluster.pk).update(jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE)
    cluster.refresh_from_db()
    ProjectSlurmAccount.objects.create(project=make_project(make_tenant()), cluster=cluster, state="ready")
    return cluster


def test_a_report_whose_accounting_cannot_be_read_fails_and_says_to_request_a_new_one() -> None:
    cluster = _unreachable_cluster()
    now = timezone.now()
    report = ReconciliationReport.objects.create(cluster=cluster, period_start=now - timedelta(days=1), period_end=now)

    failed = reconciliation_report_run(report_id=report.pk)

    assert failed.state == ReconciliationState.FAILED
    assert failed.error.startswith("Slurm's accounting on cluster matrixcluster could not be read (")
    assert failed.error.endswith(
        "), so nothing was compared. Request a new report for the period once the cluster answers again."
    )
    assert (failed.summary, failed.findings) == ({}, [])
    assert failed.finished_at is not None
    # A second delivery leaves it failed, as it was.
    again = reconciliation_report_run(report_id=report.pk)
    assert (again.state, again.error, again.finished_at) == (failed.state, failed.error, failed.finished_at)


# API ----------------------------------------------------------------------------------------------------


def _done_report(cluster: Cluster, requested_by: User | None = None) -> ReconciliationReport:
    now = timezone.now()
    findings = [
        {
            "kind": kind,
            "slurm_job_id": number,
            "account": "acct",
            "job": None,
            "portal_gpu_seconds": None,
            "slurm_gpu_seconds": 60,
            "detail": f"finding {number}",
        }
        for number, kind in enumerate(["missing_in_portal", "unpriced", "unpriced"], start=1)
    ]
    summary = {
        "accounts": 1,
        "portal_jobs": 2,
        "slurm_jobs": 3,
        "jobs_compared": 2,
        "counts": {"missing_in_slurm": 0, "missing_in_portal": 1, "gpu_seconds_differ": 0, "unpriced": 2},
        "portal_gpu_seconds": 120,
        "slurm_gpu_seconds": 180,
        "difference_gpu_seconds": -60,
        "portal_gpu_hours": "0.03",
        "slurm_gpu_hours": "0.05",
        "difference_gpu_hours": "-0.02",
        "findings_total": 3,
        "findings_stored": 3,
        "findings_truncated": False,
    }
    return ReconciliationReport.objects.create(
        cluster=cluster,
        period_start=now - timedelta(days=2),
        period_end=now - timedelta(days=1),
        state=ReconciliationState.DONE,
        requested_by=requested_by,
        started_at=now,
        finished_at=now,
        summary=summary,
        findings=findings,
    )


def test_a_portal_admin_requests_a_report_and_reads_it_with_its_findings(enqueued: list[int]) -> None:
    cluster = make_matrix_cluster()
    admin = make_user("recon-admin", is_staff=True)
    api = _api(admin)
    today = timezone.now().date()
    start, end = today - timedelta(days=10), today - timedelta(days=1)

    response = api.post(
        "/api/v1/reconciliation-reports/",
        {"cluster": "matrixcluster", "start": start.isoformat(), "end": end.isoformat()},
        format="json",
    )

    assert response.status_code == 202, response.json()
    report = ReconciliationReport.objects.get()
    assert response["Location"] == f"/api/v1/reconciliation-reports/{report.pk}/"
    body = response.json()
    assert body == {
        "id": report.pk,
        "cluster": "matrixcluster",
        "period_start": f"{start.isoformat()}T00:00:00Z",
        "period_end": f"{end.isoformat()}T00:00:00Z",
        "state": "pending",
        "requested_by": "recon-admin",
        "created_at": body["created_at"],
        "started_at": None,
        "finished_at": None,
        "summary": None,
        "error": "",
        "links": {"self": f"/api/v1/reconciliation-reports/{report.pk}/"},
    }
    assert enqueued == [report.pk]
    assert AuditEvent.objects.filter(action="reconciliation_report.request").count() == 1

    done = _done_report(cluster, requested_by=admin)
    listing = api.get("/api/v1/reconciliation-reports/?state=done").json()
    assert listing["count"] == 1
    [row] = listing["results"]
    assert (row["id"], row["state"], row["summary"]["counts"]["unpriced"]) == (done.pk, "done", 2)
    assert "findings" not in row
    assert api.get("/api/v1/reconciliation-reports/?cluster=matrixcluster").json()["count"] == 2
    assert api.get("/api/v1/reconciliation-reports/?cluster=elsewhere").json()["count"] == 0

    detail = api.get(f"/api/v1/reconciliation-reports/{done.pk}/").json()
    assert [finding["detail"] for finding in detail["findings"]] == ["finding 1", "finding 2", "finding 3"]
    assert detail["summary"]["difference_gpu_hours"] == "-0.02"
    only = api.get(f"/api/v1/reconciliation-reports/{done.pk}/?kind=unpriced").json()
    assert [finding["slurm_job_id"] for finding in only["findings"]] == [2, 3]

    pending = api.get(f"/api/v1/reconciliation-reports/{report.pk}/").json()
    assert (pending["state"], pending["summary"], pending["findings"]) == ("pending", None, [])

    missing = api.get("/api/v1/reconciliation-reports/999999/")
    assert missing.status_code == 404
    assert missing.json() == {
        "code": "not_found",
        "message": "No reconciliation report 999999 exists; list them at /api/v1/reconciliation-reports/.",
        "fields": {},
    }


def test_an_end_left_out_means_now_and_a_datetime_keeps_its_offset(enqueued: list[int]) -> None:
    make_matrix_cluster()
    api = _api(make_user(is_staff=True))
    before = timezone.now()
    start = (before - timedelta(days=2)).replace(microsecond=0)
    given = start.astimezone(timezone.get_fixed_timezone(120)).isoformat()  # e.g. 2026-01-01T12:00:00+02:00

    response = api.post("/api/v1/reconciliation-reports/", {"cluster": "matrixcluster", "start": given}, format="json")

    assert response.status_code == 202, response.json()
    report = ReconciliationReport.objects.get()
    assert report.period_start == start
    assert response.json()["period_start"] == start.isoformat().replace("+00:00", "Z")
    assert before <= report.period_end <= timezone.now()
    assert enqueued == [report.pk]


@pytest.mark.parametrize("role", ["tenant_admin", "member", "anonymous"])
def test_nobody_but_portal_admins_sees_or_requests_a_report(role: str, enqueued: list[int]) -> None:
    cluster = make_matrix_cluster()
    tenant_admin = make_user()
    tenant = make_tenant(admin=tenant_admin)
    member = make_user()
    add_project_member(make_project(tenant), member)
    report = _done_report(cluster)
    user = {"tenant_admin": tenant_admin, "member": member, "anonymous": None}[role]
    api = _api(user)
    today = timezone.now().date()

    answers = [
        api.get("/api/v1/reconciliation-reports/"),
        api.get(f"/api/v1/reconciliation-reports/{report.pk}/"),
        api.post(
            "/api/v1/reconciliation-reports/",
            {"cluster": "nope", "start": (today - timedelta(days=2)).isoformat(), "end": today.isoformat()},
            format="json",
        ),
    ]

    if user is None:
        assert {answer.status_code for answer in answers} == {401}
    else:
        for answer in answers:
            assert answer.status_code == 403
            assert answer.json() == {
                "code": "permission_denied",
                "message": (
                    "Reconciliation reports are for portal admins only; ask one of the portal's admins for a report."
                ),
                "fields": {},
            }
    assert list(ReconciliationReport.objects.values_list("pk", flat=True)) == [report.pk]
    assert enqueued == []


def _post(api: APIClient, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/api/v1/reconciliation-reports/", body, format="json")
    assert response.status_code == 400, response.json()
    answer: dict[str, Any] = response.json()
    return answer


def test_a_bad_period_or_cluster_is_refused_with_what_to_fix(enqueued: list[int]) -> None:
    make_matrix_cluster()
    api = _api(make_user(is_staff=True))
    today = timezone.now().date()
    week_ago = (today - timedelta(days=7)).isoformat()

    reversed_period = _post(api, {"cluster": "matrixcluster", "start": week_ago, "end": "2020-01-01"})
    message = f"The period must end after it starts ({week_ago} 00:00:00 UTC); choose a later end."
    assert reversed_period == {"code": "invalid", "message": f"end: {message}", "fields": {"end": [message]}}

    unknown = _post(api, {"cluster": "nope", "start": week_ago})
    message = "There is no cluster 'nope'; choose one of: matrixcluster."
    assert unknown == {"code": "invalid", "message": f"cluster: {message}", "fields": {"cluster": [message]}}

    tomorrow = (today + timedelta(days=1)).isoformat()
    future = _post(api, {"cluster": "matrixcluster", "start": week_ago, "end": tomorrow})
    assert future["fields"]["end"][0].startswith(f"The period must be over: {tomorrow} 00:00:00 UTC is in the future;")

    too_long = _post(api, {"cluster": "matrixcluster", "start": (today - timedelta(days=100)).isoformat()})
    assert too_long["fields"]["start"][0].startswith("A report covers at most 92 days; this period has 100.")

    malformed = _post(api, {"cluster": "matrixcluster", "start": "last week"})
    assert malformed["fields"] == {
        "start": ["Give a date (2026-12-01, meaning midnight UTC) or an ISO 8601 date-time."]
    }

    assert not ReconciliationReport.objects.exists()
    assert enqueued == []


def test_a_period_too_long_is_counted_in_whole_tenths_of_a_day_rounded_down(
    enqueued: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_matrix_cluster()
    api = _api(make_user(is_staff=True))
    late_evening = timezone.now().replace(hour=23, minute=30, second=0, microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: late_evening)
    start = (late_evening.date() - timedelta(days=100)).isoformat()

    too_long = _post(api, {"cluster": "matrixcluster", "start": start})

    # 100 days and 23.5 hours: "100.9", where rounding said "101.0" late in the day.
    assert too_long["fields"]["start"][0].startswith("A report covers at most 92 days; this period has 100.9.")


# Admin --------------------------------------------------------------------------------------------------


def test_the_admin_lists_reports_shows_findings_and_requests_a_new_one(enqueued: list[int]) -> None:
    cluster = make_matrix_cluster()
    admin = make_user(is_staff=True)
    browser = Client()
    assert browser.login(username=admin.username, password=PASSWORD)
    done = _done_report(cluster)

    listing = browser.get("/admin/billing/reconciliationreport/")
    assert listing.status_code == 200
    assert "Missing in portal" in listing.content.decode()

    page = browser.get(f"/admin/billing/reconciliationreport/{done.pk}/change/").content.decode()
    assert "<td>finding 3</td>" in page
    assert "In Slurm&#x27;s accounting, unknown to the portal" in page

    today = timezone.now().date()
    form = {
        "cluster": cluster.pk,
        "period_start_0": (today - timedelta(days=3)).isoformat(),
        "period_start_1": "00:00:00",
        "period_end_0": (today - timedelta(days=1)).isoformat(),
        "period_end_1": "00:00:00",
    }
    refused = browser.post("/admin/billing/reconciliationreport/add/", {**form, "period_end_0": "2020-01-01"})
    assert refused.status_code == 200
    assert "The period must end after it starts" in refused.content.decode()
    assert ReconciliationReport.objects.count() == 1

    added = browser.post("/admin/billing/reconciliationreport/add/", form)
    assert added.status_code == 302
    report = ReconciliationReport.objects.exclude(pk=done.pk).get()
    assert (report.state, report.requested_by, report.period_end.date()) == (
        "pending",
        admin,
        today - timedelta(days=1),
    )
    assert enqueued == [report.pk]

    again = browser.post(
        "/admin/billing/reconciliationreport/", {"action": "request_again", "_selected_action": [done.pk]}
    )
    assert again.status_code == 302
    assert ReconciliationReport.objects.count() == 3
    assert len(enqueued) == 2
