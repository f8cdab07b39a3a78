"""Reconciliation: the portal's usage of a cluster and period compared with Slurm's accounting, job by job.

A report covers the jobs that ended in `[period_start, period_end)`. It lists jobs the portal knows that
Slurm's accounting does not (`missing_in_slurm`), finished GPU jobs in the projects' Slurm accounts that the
portal does not know (`missing_in_portal`), jobs whose GPU-seconds differ (`gpu_seconds_differ`), and jobs in
both that the portal has not priced yet (`unpriced`). A job array is compared task by task: each task is a Slurm
job of its own (its own id, record, charge and usage record), and counts as one job in the summary. The
portal's figure of a job is its usage record, else its charge in the quota ledger; Slurm's is elapsed seconds x
allocated GPUs from its accounting record.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from billing.models import ReconciliationKind, ReconciliationReport, ReconciliationState, UsageRecord
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ProjectSlurmAccount
from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import AccountingRecord
from jobs.models import FINAL_JOB_STATES, Job, JobArrayTask
from jobs.quota_usage import accounting_attempts_of, is_accounting_record_of
from portal.queue import task_enqueue_on_commit
from quotas.models import LedgerEntry, LedgerKind
from quotas.units import gpu_seconds_to_hours
from tenants.selectors import AnyUser, is_portal_admin
from tenants.services import Actor, audit_record

logger = logging.getLogger(__name__)

# Long enough for a quarter; longer periods make one accounting request too large for slurmdbd to answer
# within the client's timeout.
MAX_PERIOD = timedelta(days=92)
# A report stores at most this many findings (the counts and totals still cover all of them): a cluster whose
# accounting was lost for weeks would otherwise write a row of many megabytes.
MAX_FINDINGS = 5000
# The accounting window reaches this far beyond the period on both sides: Slurm's clock and the portal's
# differ a little, so a portal job that ended just inside the period can have a record that ended just outside.
ACCOUNTING_WINDOW_MARGIN = timedelta(minutes=10)
# Accounts per accounting request: the list travels in the query string, which slurmrestd limits.
ACCOUNTS_PER_REQUEST = 100
# A portal job the window query did not return is looked up by its id (at most this many per report): on
# 22.05 the window query has, rarely, left out a record that the by-id lookup returned.
BY_ID_LOOKUPS_PER_REPORT = 100

_KIND_ORDER = {kind: index for index, kind in enumerate(ReconciliationKind.values)}


def reconciliation_report_path(report: ReconciliationReport) -> str:
    return f"/api/v1/reconciliation-reports/{report.pk}/"


# Reads -------------------------------------------------------------------------------------------------


def reconciliation_access_check(*, user: AnyUser | None) -> None:
    """Reports cover every tenant's jobs: only portal admins read or request them."""
    if user is None or not is_portal_admin(user):
        raise PermissionDenied(
            "Reconciliation reports are for portal admins only; ask one of the portal's admins for a report."
        )


def reconciliation_report_list_for_user(
    *, user: AnyUser, cluster_name: str | None = None, state: str | None = None
) -> QuerySet[ReconciliationReport]:
    """The reports, newest first, without their findings (portal admins only)."""
    reconciliation_access_check(user=user)
    reports = ReconciliationReport.objects.select_related("cluster", "requested_by").defer("findings")
    if cluster_name:
        reports = reports.filter(cluster__name=cluster_name)
    if state:
        reports = reports.filter(state=state)
    return reports


def reconciliation_report_get_for_user(*, user: AnyUser, report_id: int) -> ReconciliationReport:
    reconciliation_access_check(user=user)
    report = ReconciliationReport.objects.select_related("cluster", "requested_by").filter(pk=report_id).first()
    if report is None:
        raise Http404(f"No reconciliation report {report_id} exists; list them at /api/v1/reconciliation-reports/.")
    return report


# Requesting a report -----------------------------------------------------------------------------------


def reconciliation_period_validate(
    *, period_start: datetime, period_end: datetime, now: datetime | None = None
) -> None:
    """Refuse a period that is empty, reversed, not over yet, or longer than MAX_PERIOD (errors keyed by the
    API's field names, `start` and `end`)."""
    now = now or timezone.now()
    if period_end <= period_start:
        raise ValidationError(
            {
                "end": [
                    f"The period must end after it starts ({period_start:%Y-%m-%d %H:%M:%S} UTC); choose a later end."
                ]
            }
        )
    if period_end > now:
        raise ValidationError(
            {
                "end": [
                    f"The period must be over: {period_end:%Y-%m-%d %H:%M:%S} UTC is in the future; choose an end "
                    f"no later than now ({now:%Y-%m-%d %H:%M:%S} UTC), or leave it out to mean now."
                ]
            }
        )
    if period_end - period_start > MAX_PERIOD:
        raise ValidationError(
            {
                "start": [
                    f"A report covers at most {MAX_PERIOD.days} days; this period has "
                    # Rounded down: 100 days and 23 hours is "100.9", never "101.0".
                    f"{math.floor((period_end - period_start) / timedelta(days=1) * 10) / 10:.1f}. "
                    "Split it into shorter periods."
                ]
            }
        )


def reconciliation_report_request(
    *, actor: Actor, cluster: Cluster, period_start: datetime, period_end: datetime
) -> ReconciliationReport:
    """A pending report of the cluster's jobs that ended in `[period_start, period_end)`, computed by a worker."""

    reconciliation_access_check(user=actor)
    reconciliation_period_validate(period_start=period_start, period_end=period_end)
    with transaction.atomic():
        report = ReconciliationReport.objects.create(
            cluster=cluster,
            period_start=period_start,
            period_end=period_end,
            requested_by=actor if actor is not None and actor.is_authenticated else None,
        )
        audit_record(
            actor=actor,
            action="reconciliation_report.request",
            target=report,
            tenant=None,
            before=None,
            after={
                "cluster": cluster.name,
                "period_start": period_start.isoformat(),
                "period_end": period_end.isoformat(),
            },
        )
        task_enqueue_on_commit(
            "billing.tasks.reconciliation_report_run", report.pk, fallback="run the reconciliation again to finish it"
        )
    return report


# Running a report --------------------------------------------------------------------------------------


def reconciliation_report_run(*, report_id: int, client: SlurmClient | None = None) -> ReconciliationReport:
    """Compute the report. Idempotent: a done or failed report is left as it is; a pending one, or one whose
    worker died while running, is computed (again) from scratch."""
    with transaction.atomic():
        report = (
            ReconciliationReport.objects.select_for_update(of=("self",), no_key=True)
            .select_related("cluster")
            .get(pk=report_id)
        )
        if report.state in {ReconciliationState.DONE, ReconciliationState.FAILED}:
            return report
        report.state = ReconciliationState.RUNNING
        report.started_at = timezone.now()
        report.save(update_fields=["state", "started_at"])

    cluster = report.cluster
    try:
        comparison = _compare(
            cluster=cluster,
            period_start=report.period_start,
            period_end=report.period_end,
            client=client or slurm_client_for(cluster),
        )
    except SlurmError as exc:
        logger.warning("reconciliation report %s: Slurm's accounting of %s failed: %s", report.pk, cluster.name, exc)
        return _finish_failed(
            report,
            f"Slurm's accounting on cluster {cluster.name} could not be read ({exc}), so nothing was compared. "
            "Request a new report for the period once the cluster answers again.",
        )
    except Exception:
        logger.exception("reconciliation report %s failed", report.pk)
        _finish_failed(
            report,
            "The report stopped on an unexpected error (logged for the operators), so nothing was compared. "
            "Request a new report for the period; if it fails again, tell the portal's operators.",
        )
        raise

    findings = sorted(
        comparison.findings, key=lambda finding: (_KIND_ORDER[finding["kind"]], finding["slurm_job_id"] or 0)
    )
    report.summary = _summary(comparison, stored=min(len(findings), MAX_FINDINGS))
    report.findings = findings[:MAX_FINDINGS]
    report.state = ReconciliationState.DONE
    report.finished_at = timezone.now()
    report.error = ""
    report.save(update_fields=["summary", "findings", "state", "finished_at", "error"])
    return report


def _finish_failed(report: ReconciliationReport, error: str) -> ReconciliationReport:
    report.state = ReconciliationState.FAILED
    report.error = error
    report.finished_at = timezone.now()
    report.summary = {}
    report.findings = []
    report.save(update_fields=["state", "error", "finished_at", "summary", "findings"])
    return report


@dataclass
class _Comparison:
    accounts: int
    portal_jobs: int = 0
    slurm_jobs: int = 0
    jobs_compared: int = 0
    portal_gpu_seconds: int = 0
    slurm_gpu_seconds: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)


def _summary(comparison: _Comparison, *, stored: int) -> dict[str, Any]:
    counts = dict.fromkeys(ReconciliationKind.values, 0)
    for finding in comparison.findings:
        counts[finding["kind"]] += 1
    difference = comparison.portal_gpu_seconds - comparison.slurm_gpu_seconds
    return {
        "accounts": comparison.accounts,
        "portal_jobs": comparison.portal_jobs,
        "slurm_jobs": comparison.slurm_jobs,
        "jobs_compared": comparison.jobs_compared,
        "counts": counts,
        "portal_gpu_seconds": comparison.portal_gpu_seconds,
        "slurm_gpu_seconds": comparison.slurm_gpu_seconds,
        "difference_gpu_seconds": difference,
        # Strings: JSON has no decimals, and a float would show 0.30000000000000004 GPU-hours.
        "portal_gpu_hours": str(gpu_seconds_to_hours(comparison.portal_gpu_seconds)),
        "slurm_gpu_hours": str(gpu_seconds_to_hours(comparison.slurm_gpu_seconds)),
        "difference_gpu_hours": str(gpu_seconds_to_hours(difference)),
        "findings_total": len(comparison.findings),
        "findings_stored": stored,
        "findings_truncated": stored < len(comparison.findings),
    }


def _portal_jobs(*, cluster: Cluster, period_start: datetime, period_end: datetime) -> list[Job]:
    """Jobs that ran on GPUs and, in the portal, ended in the period."""
    return list(
        Job.objects.filter(
            cluster=cluster,
            state__in=FINAL_JOB_STATES,
            started_at__isnull=False,
            gpus__gt=0,
            ended_at__gte=period_start,
            ended_at__lt=period_end,
            array="",  # an array is compared task by task (_portal_tasks)
        )
        .select_related("project")
        .order_by("ended_at", "pk")
    )


def _portal_tasks(*, cluster: Cluster, period_start: datetime, period_end: datetime) -> list[JobArrayTask]:
    """Array tasks that ran on GPUs and, in the portal, ended in the period: each is a Slurm job of its own."""
    return list(
        JobArrayTask.objects.filter(
            job__cluster=cluster,
            state__in=FINAL_JOB_STATES,
            started_at__isnull=False,
            job__gpus__gt=0,
            ended_at__gte=period_start,
            ended_at__lt=period_end,
        )
        .select_related("job__project")
        .order_by("ended_at", "pk")
    )


def _task_attempts(task: JobArrayTask, candidates: list[AccountingRecord]) -> list[AccountingRecord]:
    """A task's finished accounting records (one per run, oldest first): its array's id and its index, in the
    array's account and with its tag, as the quota collection charges it."""
    job = task.job
    return sorted(
        (
            record
            for record in candidates
            if record.array_job_id == job.slurm_job_id
            and record.array_task_id == task.index
            and record.account == job.project.slurm_account
            and record.comment == job.slurm_comment
        ),
        key=lambda record: record.start_time or record.submit_time or datetime.min.replace(tzinfo=UTC),
    )


def _accounting(
    *, client: SlurmClient, cluster: Cluster, accounts: list[str], period_start: datetime, period_end: datetime
) -> list[AccountingRecord]:
    """Finished records of the accounts that ended within the window, once each (id and submit time)."""
    records: dict[tuple[int, datetime | None], AccountingRecord] = {}
    for first in range(0, len(accounts), ACCOUNTS_PER_REQUEST):
        # slurmdbd selects the jobs active at some moment of the window, so every job that ended in it is there,
        # however long ago it started. dbv0.0.38 takes a comma-separated list of accounts, as sacct -A does.
        found = client.accounting_jobs(
            account=",".join(accounts[first : first + ACCOUNTS_PER_REQUEST]),
            start_time=period_start - ACCOUNTING_WINDOW_MARGIN,
            end_time=period_end + ACCOUNTING_WINDOW_MARGIN,
        )
        for record in found:
            if record.state.is_finished and record.end_time is not None and record.cluster in {"", cluster.name}:
                records[(record.job_id, record.submit_time)] = record
    return list(records.values())


def _attempts_by_id(*, client: SlurmClient, job: Job) -> list[AccountingRecord]:
    try:
        found = client.accounting_job_records(job_id=job.slurm_job_id or 0)
    except SlurmError as exc:
        if exc.retryable:
            raise
        return []  # slurmdbd has no job of that id (22.05 says so with a refusal, "Nothing found")
    return accounting_attempts_of(job, [record for record in found if record.state.is_finished and record.end_time])


def _runs_together(attempts: list[AccountingRecord]) -> AccountingRecord | None:
    """The job's runs as one record: the last attempt's, with the elapsed time of all (a requeued job has a record
    per run, each on the same number of GPUs), so it compares with the portal's one charge."""
    if not attempts:
        return None
    return replace(attempts[-1], elapsed_seconds=sum(attempt.elapsed_seconds for attempt in attempts))


def _compare(*, cluster: Cluster, period_start: datetime, period_end: datetime, client: SlurmClient) -> _Comparison:
    portal_jobs = _portal_jobs(cluster=cluster, period_start=period_start, period_end=period_end)
    portal_tasks = _portal_tasks(cluster=cluster, period_start=period_start, period_end=period_end)
    tracked = ProjectSlurmAccount.objects.filter(cluster=cluster).values_list("project__slurm_account", flat=True)
    accounts = sorted(
        set(tracked)
        | {job.project.slurm_account for job in portal_jobs}
        | {task.job.project.slurm_account for task in portal_tasks}
    )
    records = _accounting(
        client=client, cluster=cluster, accounts=accounts, period_start=period_start, period_end=period_end
    )
    in_period = [
        record
        for record in records
        if record.gpus_allocated > 0 and record.end_time is not None and period_start <= record.end_time < period_end
    ]
    # Portal jobs that Slurm says ended in the period count too, whatever the portal says of their end (a job
    # the sync has not seen end yet, or one whose end the portal has a moment off).
    candidates = (
        # An array's id is also one of its tasks' (the task Slurm ran last): arrays are compared task by task.
        Job.objects.filter(cluster=cluster, slurm_job_id__in={record.job_id for record in in_period}, array="")
        .exclude(pk__in={job.pk for job in portal_jobs})
        .select_related("project")
    )
    extra = [job for job in candidates if any(is_accounting_record_of(job, record) for record in in_period)]
    jobs = [*portal_jobs, *extra]
    records_by_id: dict[int, list[AccountingRecord]] = {}
    for record in records:
        records_by_id.setdefault(record.job_id, []).append(record)

    job_ids = [job.pk for job in jobs]
    usage = dict(UsageRecord.objects.filter(job_id__in=job_ids).values_list("job_id", "gpu_seconds"))
    charges = dict(
        LedgerEntry.objects.filter(job_id__in=job_ids, kind=LedgerKind.CHARGE).values_list("job_id", "gpu_seconds")
    )
    comparison = _Comparison(accounts=len(accounts))
    matched: set[tuple[int, datetime | None]] = set()
    by_id_left = BY_ID_LOOKUPS_PER_REPORT
    for job in jobs:
        attempts = accounting_attempts_of(job, records_by_id.get(job.slurm_job_id or 0, []))
        if not attempts and job.slurm_job_id is not None and by_id_left:
            by_id_left -= 1
            attempts = _attempts_by_id(client=client, job=job)
        matched.update((attempt.job_id, attempt.submit_time) for attempt in attempts)
        own = _runs_together(attempts)
        _compare_job(comparison, job=job, record=own, usage=usage.get(job.pk), charge=charges.get(job.pk))
    matched |= _compare_tasks(comparison, cluster=cluster, tasks=portal_tasks, records=records, in_period=in_period)
    for record in in_period:
        if (record.job_id, record.submit_time) not in matched:
            comparison.slurm_jobs += 1
            comparison.slurm_gpu_seconds += record.gpu_seconds
            comparison.findings.append(
                _finding(
                    ReconciliationKind.MISSING_IN_PORTAL,
                    record=record,
                    account=record.account,
                    job=None,
                    portal_gpu_seconds=None,
                    detail=(
                        f"Slurm's accounting has job {record.job_id} ({record.name!r} of user {record.user_name}) in "
                        f"account {record.account}, ended {_moment(record.end_time)}, {_usage(record)}, and no portal "
                        "job matches it: the portal neither tracked nor charged it."
                    ),
                )
            )
    return comparison


def _compare_tasks(
    comparison: _Comparison,
    *,
    cluster: Cluster,
    tasks: list[JobArrayTask],
    records: list[AccountingRecord],
    in_period: list[AccountingRecord],
) -> set[tuple[int, datetime | None]]:
    """Compare each array task with its own accounting records, its usage record and its charge (both keyed by
    job and task); returns the records matched. A task Slurm says ended in the period counts too, whatever the
    portal says of its end."""
    shown = {(task.job.slurm_job_id, task.index) for task in tasks}
    wanted = {
        (record.array_job_id, record.array_task_id)
        for record in in_period
        if record.array_job_id is not None and record.array_task_id is not None
    } - shown
    if wanted:
        extra = JobArrayTask.objects.filter(
            job__cluster=cluster,
            job__slurm_job_id__in={array_id for array_id, _ in wanted},
            index__in={index for _, index in wanted},
            started_at__isnull=False,
            job__gpus__gt=0,
        ).select_related("job__project")
        tasks = [*tasks, *(task for task in extra if (task.job.slurm_job_id, task.index) in wanted)]
    if not tasks:
        return set()
    task_records = [record for record in records if record.array_task_id is not None]
    job_ids = {task.job_id for task in tasks}
    usage = {
        (job_id, index): seconds
        for job_id, index, seconds in UsageRecord.objects.filter(
            job_id__in=job_ids, array_task__isnull=False
        ).values_list("job_id", "array_task", "gpu_seconds")
    }
    charges = {
        (job_id, index): seconds
        for job_id, index, seconds in LedgerEntry.objects.filter(
            job_id__in=job_ids, array_task__isnull=False, kind=LedgerKind.CHARGE
        ).values_list("job_id", "array_task", "gpu_seconds")
    }
    matched: set[tuple[int, datetime | None]] = set()
    for task in tasks:
        attempts = _task_attempts(task, task_records)
        matched.update((attempt.job_id, attempt.submit_time) for attempt in attempts)
        key = (task.job_id, task.index)
        _compare_job(
            comparison,
            job=task.job,
            task=task,
            record=_runs_together(attempts),
            usage=usage.get(key),
            charge=charges.get(key),
        )
    return matched


def _compare_job(
    comparison: _Comparison,
    *,
    job: Job,
    record: AccountingRecord | None,
    usage: int | None,
    charge: int | None,
    task: JobArrayTask | None = None,
) -> None:
    """Compare a plain job, or one task of an array (`task`), with Slurm's record of it."""
    portal_gpu_seconds = usage if usage is not None else charge
    comparison.portal_jobs += 1
    comparison.portal_gpu_seconds += portal_gpu_seconds or 0
    account = job.project.slurm_account
    what = f"The portal's job {job.name!r}"
    if task is not None:
        what = f"Task {task.index} of the portal's job {job.name!r}"
    slurm_job_id = (task.slurm_job_id or job.slurm_job_id) if task is not None else job.slurm_job_id
    if record is None:
        counted = (
            f"the portal counts {portal_gpu_seconds} GPU-seconds for it"
            if portal_gpu_seconds is not None
            else "the portal has not charged it"
        )
        comparison.findings.append(
            _finding(
                ReconciliationKind.MISSING_IN_SLURM,
                record=None,
                slurm_job_id=slurm_job_id,
                account=account,
                job=job,
                portal_gpu_seconds=portal_gpu_seconds,
                detail=(
                    f"{what} ran with {job.total_gpus} GPU(s) as Slurm job {slurm_job_id} and ended "
                    f"{_moment(task.ended_at if task is not None else job.ended_at)}, but Slurm's accounting has no "
                    f"finished record of it in account {account}; {counted}."
                ),
            )
        )
        return
    comparison.slurm_jobs += 1
    comparison.jobs_compared += 1
    comparison.slurm_gpu_seconds += record.gpu_seconds
    if portal_gpu_seconds is not None and portal_gpu_seconds != record.gpu_seconds:
        source = "its usage record" if usage is not None else "its quota charge (it has no usage record yet)"
        comparison.findings.append(
            _finding(
                ReconciliationKind.GPU_SECONDS_DIFFER,
                record=record,
                account=account,
                job=job,
                portal_gpu_seconds=portal_gpu_seconds,
                detail=(
                    f"The portal counts {portal_gpu_seconds} GPU-seconds ({source}) and Slurm's accounting "
                    f"{record.gpu_seconds} ({_usage(record)}): the portal is off by "
                    f"{portal_gpu_seconds - record.gpu_seconds:+d} GPU-seconds."
                ),
            )
        )
    elif usage is None:
        why = (
            "charged but not priced yet: no rate was in force when it ran, or the usage import has not run since"
            if charge is not None
            else "not charged yet, so not priced: the portal's quota collection has not found its record yet"
        )
        comparison.findings.append(
            _finding(
                ReconciliationKind.UNPRICED,
                record=record,
                account=account,
                job=job,
                portal_gpu_seconds=portal_gpu_seconds,
                detail=(
                    f"Slurm's accounting has {record.gpu_seconds} GPU-seconds ({_usage(record)}); the "
                    f"{'task' if task is not None else 'job'} is {why}."
                ),
            )
        )


def _finding(
    kind: ReconciliationKind,
    *,
    record: AccountingRecord | None,
    account: str,
    job: Job | None,
    portal_gpu_seconds: int | None,
    detail: str,
    slurm_job_id: int | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind.value,
        "slurm_job_id": record.job_id if record is not None else slurm_job_id,
        "account": account,
        "job": str(job.pk) if job is not None else None,
        "portal_gpu_seconds": portal_gpu_seconds,
        "slurm_gpu_seconds": record.gpu_seconds if record is not None else None,
        "detail": detail,
    }


def _usage(record: AccountingRecord) -> str:
    return f"{record.elapsed_seconds} s x {record.gpus_allocated} GPU{'s' if record.gpus_allocated != 1 else ''}"


def _moment(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment is not None else "at an unknown time"
