"""The ledger check that ends every drill: after the fault, nothing was lost, doubled, left open or stuck.

It waits (bounded) until every job of the drill's project is final and every reservation of a final job is
closed, then compares three records that must agree:
- the client's: each submission was accepted (and its job is in the portal exactly once) or refused with a reason;
- Slurm's (slurmctld's listing and slurmdbd's accounting, by the portal's comment tag): each delivered job is
  there exactly once, a job that never reached Slurm was rejected with a reason or cancelled before it;
- the quota ledger's: each job reserved once; a job that ran is charged exactly what Slurm's accounting says it
  used (elapsed x GPUs), a job that never ran has its reservation released; the allocation's balances equal the
  sums of its ledger rows.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from burst import Submission
from harness import Drill

from clusters.slurm import SlurmError
from clusters.slurm.types import AccountingRecord
from jobs.models import FINAL_JOB_STATES, RECOVERED_DETAIL, DatabaseRestore, Job, JobState, JobTransition
from quotas.models import Allocation, LedgerEntry, LedgerKind

SETTLE_SECONDS = 300
EXAMPLES = 5  # examples printed per kind of finding


@dataclass
class LedgerReport:
    failures: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    lines: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, kind: str, example: str) -> None:
        self.failures[kind].append(example)

    def print(self) -> None:
        print("  ledger check:", flush=True)
        for line in self.lines:
            print(f"    {line}")
        for kind, examples in self.failures.items():
            shown = "; ".join(examples[:EXAMPLES]) + (" ..." if len(examples) > EXAMPLES else "")
            print(f"    FAILED: {kind}: {len(examples)} ({shown})")
        print(f"    ledger: {'PASS' if self.passed else 'FAIL'}", flush=True)


@dataclass
class _QuotaRows:
    reserved: list[LedgerEntry] = field(default_factory=list)
    released: list[LedgerEntry] = field(default_factory=list)
    charged: list[LedgerEntry] = field(default_factory=list)

    @property
    def open_reservations(self) -> int:
        return len(self.reserved) - len(self.released)


def ledger_check(drill: Drill, submissions: Sequence[Submission], *, settle_seconds: float = SETTLE_SECONDS) -> bool:
    """Wait for the drill's jobs to settle, check the three records against each other, print what was found;
    whether everything agreed."""
    waited = _wait_settled(drill, timeout_seconds=settle_seconds)
    report = LedgerReport()
    report.lines.append(f"waited {waited:.0f} s for every job to be final and every reservation closed")
    jobs = {str(job.pk): job for job in Job.objects.filter(project=drill.world.project)}
    rebuilt = {
        str(job_id)
        for job_id in JobTransition.objects.filter(
            job__project=drill.world.project, detail__startswith=RECOVERED_DETAIL
        ).values_list("job_id", flat=True)
    }
    if rebuilt:
        report.lines.append(f"{len(rebuilt)} jobs were rebuilt from Slurm after a restore (known by their id)")
    never_delivered = {job_id for restore in DatabaseRestore.objects.all() for job_id in restore.undelivered_jobs}
    _check_submissions(report, submissions, jobs, rebuilt, never_delivered - set(jobs))
    slurm_ids_by_tag, records = _slurm_jobs(drill, report)
    quota = _quota_rows(drill)
    _check_jobs(report, jobs, slurm_ids_by_tag, quota, records)
    _check_orphans(report, jobs, slurm_ids_by_tag)
    _check_allocations(report, drill)
    report.print()
    return report.passed


def _wait_settled(drill: Drill, *, timeout_seconds: float) -> float:
    started = time.monotonic()
    said_at = 0.0
    while True:
        active, open_final = _unsettled(drill)
        waited = time.monotonic() - started
        if not active and not open_final:
            return waited
        if waited > timeout_seconds:
            drill.say(f"gave up waiting after {waited:.0f} s: {active} jobs not final, {open_final} open reservations")
            return waited
        if waited - said_at >= 15:
            said_at = waited
            drill.say(f"waiting: {active} jobs not final yet, {open_final} final jobs with an open reservation")
        time.sleep(1)


def _unsettled(drill: Drill) -> tuple[int, int]:
    jobs = Job.objects.filter(project=drill.world.project)
    active = jobs.exclude(state__in=FINAL_JOB_STATES).count()
    final_ids = set(jobs.filter(state__in=FINAL_JOB_STATES).values_list("pk", flat=True))
    balance: Counter[object] = Counter()
    for job_id, kind in LedgerEntry.objects.filter(job_id__in=final_ids).values_list("job_id", "kind"):
        balance[job_id] += 1 if kind == LedgerKind.RESERVE else -1 if kind == LedgerKind.RELEASE else 0
    return active, sum(1 for count in balance.values() if count > 0)


def _check_submissions(
    report: LedgerReport,
    submissions: Sequence[Submission],
    jobs: dict[str, Job],
    rebuilt: set[str],
    never_delivered: set[str],
) -> None:
    """`rebuilt`: jobs a restore lost and the portal rebuilt from Slurm, whose Idempotency-Key Slurm never had.
    `never_delivered`: jobs accepted after the backup that had not reached Slurm when the portal stopped, which
    the portal recorded on the restore (`manage.py restore_check` lists them): lost, never run, never charged."""
    accepted = [submission for submission in submissions if submission.accepted]
    refused = [submission for submission in submissions if submission.refused]
    unanswered = [submission for submission in submissions if not submission.accepted and not submission.refused]
    reasons = Counter(submission.refusal[:120] for submission in refused)
    report.lines.append(
        f"client: {len(submissions)} submissions, {len(accepted)} accepted, {len(refused)} refused, "
        f"{len(unanswered)} never answered"
        + (f"; refusals: {', '.join(f'{count} x {reason!r}' for reason, count in reasons.items())}" if refused else "")
    )
    for submission in unanswered:
        report.fail("never answered by the portal", f"#{submission.number} {submission.problems[-1:]}")
    for submission in submissions:
        crashes = [problem for problem in submission.problems if problem.startswith("HTTP 5")]
        # 503 is a clear "not now, try again"; any other 5xx is the portal failing, even if a retry then worked.
        if any(not problem.startswith("HTTP 503") for problem in crashes):
            report.fail("answered with a server error (other than 503)", f"#{submission.number} {crashes[0][:120]}")
    for submission in refused:
        if not submission.refusal:
            report.fail("refused without a reason", f"#{submission.number} HTTP {submission.status}")
    rows_by_key: dict[str, list[Job]] = defaultdict(list)
    for job_id, job in jobs.items():
        if not job.is_external and job_id not in rebuilt:
            rows_by_key[job.idempotency_key].append(job)
    lost = [submission for submission in accepted if submission.job_id in never_delivered]
    if lost:
        report.lines.append(
            f"{len(lost)} accepted jobs had not reached Slurm when the portal stopped: lost with the restore, "
            "listed by restore_check, never run or charged"
        )
    for submission in accepted:
        stored = jobs.get(submission.job_id or "")
        if stored is None and submission.job_id in never_delivered:
            continue
        if stored is None or (stored.idempotency_key != submission.key and str(stored.pk) not in rebuilt):
            report.fail("accepted but not in the portal", f"#{submission.number} job {submission.job_id}")
    sent = {submission.key: submission for submission in submissions}
    for key, rows in rows_by_key.items():
        if len(rows) > 1:
            report.fail("one Idempotency-Key, several jobs", f"{key}: {len(rows)} jobs")
        sender = sent.get(key)
        if sender is None:
            report.fail("jobs nobody submitted", f"{len(rows)} with key {key!r}")
        elif not sender.accepted:
            report.fail("stored although the client was refused or never answered", f"#{sender.number}")
    answered = {submission.job_id for submission in accepted}
    for job_id in rebuilt - answered:
        report.fail("rebuilt from Slurm, but no accepted submission has its id", f"job {job_id[:8]}")
    externals = [job for job in jobs.values() if job.is_external]
    for job in externals:
        report.fail("Slurm jobs without the portal's tag in the account", f"Slurm job {job.slurm_job_id}")


def _slurm_jobs(drill: Drill, report: LedgerReport) -> tuple[dict[str, set[int]], dict[int, AccountingRecord]]:
    """Slurm job ids per portal tag, from accounting and slurmctld's listing; the accounting records by id (a
    requeued job's runs added up)."""
    since = drill.started_at - timedelta(minutes=5)
    ids_by_tag: dict[str, set[int]] = defaultdict(set)
    records: dict[int, AccountingRecord] = {}
    try:
        for record in drill.slurm.accounting_jobs(account=drill.account, start_time=since):
            ids_by_tag[record.comment].add(record.job_id)
            if record.state.is_finished:
                # A job Slurm requeued has one finished record per run (NODE_FAIL, then COMPLETED): its use is
                # their sum, which is what the portal charges.
                earlier = records.get(record.job_id)
                ran = record.elapsed_seconds + (earlier.elapsed_seconds if earlier else 0)
                records[record.job_id] = replace(record, elapsed_seconds=ran)
        listing = drill.slurm.list_jobs()
    except SlurmError as exc:
        report.fail("Slurm could not be asked", str(exc))
        return ids_by_tag, records
    for slurm_job in listing.jobs if listing else ():
        if slurm_job.account == drill.account:
            ids_by_tag[slurm_job.comment].add(slurm_job.job_id)
    return ids_by_tag, records


def _quota_rows(drill: Drill) -> dict[str, _QuotaRows]:
    rows: dict[str, _QuotaRows] = defaultdict(_QuotaRows)
    for entry in LedgerEntry.objects.filter(project=drill.world.project, job__isnull=False):
        job_rows = rows[str(entry.job_id)]
        if entry.kind == LedgerKind.RESERVE:
            job_rows.reserved.append(entry)
        elif entry.kind == LedgerKind.RELEASE:
            job_rows.released.append(entry)
        elif entry.kind == LedgerKind.CHARGE:
            job_rows.charged.append(entry)
    return rows


def _check_jobs(
    report: LedgerReport,
    jobs: dict[str, Job],
    slurm_ids_by_tag: dict[str, set[int]],
    quota: dict[str, _QuotaRows],
    records: dict[int, AccountingRecord],
) -> None:
    states = Counter(job.state for job in jobs.values())
    report.lines.append(
        f"portal: {len(jobs)} jobs; " + ", ".join(f"{state} {count}" for state, count in sorted(states.items()))
    )
    once = charged = released = matched = 0
    charged_seconds = 0
    for job_id, job in jobs.items():
        label = f"job {job_id[:8]}"
        if job.state not in FINAL_JOB_STATES:
            report.fail("stuck in a non-final state", f"{label} {job.state} ({job.last_error[:80]})")
        if job.state == JobState.REJECTED and not job.last_error:
            report.fail("rejected without a reason", label)
        in_slurm = slurm_ids_by_tag.get(job.slurm_comment, set())
        if job.slurm_job_id is not None:
            if in_slurm == {job.slurm_job_id}:
                once += 1
            else:
                report.fail(
                    "not in Slurm exactly once", f"{label} Slurm job {job.slurm_job_id}, found {sorted(in_slurm)}"
                )
        elif job.state in FINAL_JOB_STATES and job.state not in (JobState.REJECTED, JobState.CANCELLED):
            report.fail("final without reaching Slurm, neither rejected nor cancelled", f"{label} {job.state}")
        elif any(records.get(slurm_id) is None or records[slurm_id].elapsed_seconds > 0 for slurm_id in in_slurm):
            report.fail("never reached Slurm in the portal, but ran there", f"{label} Slurm {sorted(in_slurm)}")
        rows = quota.get(job_id, _QuotaRows())
        if len(rows.reserved) != 1:
            report.fail("not reserved exactly once", f"{label}: {len(rows.reserved)} reservations")
        if job.state in FINAL_JOB_STATES and rows.open_reservations > 0:
            report.fail("final with an open reservation", f"{label} {job.state}")
        if len(rows.charged) > 1:
            report.fail("charged more than once", f"{label}: {len(rows.charged)} charges")
        if job.started_at is None:
            released += bool(rows.released)
            if rows.charged:
                report.fail("charged although it never ran", label)
            continue
        if not rows.charged:
            report.fail("ran but was not charged", f"{label} Slurm job {job.slurm_job_id}")
            continue
        charged += 1
        charge = rows.charged[0].gpu_seconds
        charged_seconds += charge
        record = records.get(job.slurm_job_id or 0)
        if record is None:
            report.fail("charged without an accounting record", f"{label} Slurm job {job.slurm_job_id}")
        elif record.gpu_seconds != charge:
            report.fail(
                "charge differs from Slurm's accounting",
                f"{label}: charged {charge} GPU-s, accounting {record.elapsed_seconds} s x {record.gpus_allocated}",
            )
        else:
            matched += 1
    delivered = sum(job.slurm_job_id is not None for job in jobs.values())
    report.lines.append(f"Slurm: {once} of {delivered} delivered jobs found in Slurm exactly once (by comment tag)")
    report.lines.append(
        f"quota: {charged} jobs charged ({charged_seconds} GPU-s), {matched} of them equal to Slurm's accounting; "
        f"{released} reservations of jobs that never ran released"
    )


def _check_orphans(report: LedgerReport, jobs: dict[str, Job], slurm_ids_by_tag: dict[str, set[int]]) -> None:
    """Slurm jobs in the account whose tag names no portal job: a submission the portal lost track of."""
    tags = {job.slurm_comment for job in jobs.values()}
    for tag, slurm_ids in slurm_ids_by_tag.items():
        if tag and tag not in tags:
            report.fail("in Slurm with a tag the portal does not know", f"{tag}: {sorted(slurm_ids)}")


def _check_allocations(report: LedgerReport, drill: Drill) -> None:
    for allocation in Allocation.objects.filter(project=drill.world.project):
        sums: Counter[str] = Counter()
        for kind, gpu_seconds in LedgerEntry.objects.filter(allocation=allocation).values_list("kind", "gpu_seconds"):
            sums[kind] += gpu_seconds
        reserved = sums[LedgerKind.RESERVE] - sums[LedgerKind.RELEASE]
        if (allocation.reserved_gpu_seconds, allocation.charged_gpu_seconds) != (reserved, sums[LedgerKind.CHARGE]):
            report.fail(
                "allocation balance differs from its ledger",
                f"allocation {allocation.pk}: reserved {allocation.reserved_gpu_seconds} vs {reserved}, "
                f"charged {allocation.charged_gpu_seconds} vs {sums[LedgerKind.CHARGE]}",
            )
        else:
            report.lines.append(
                f"allocation {allocation.pk}: balances equal its ledger (reserved {reserved} GPU-s open, "
                f"charged {sums[LedgerKind.CHARGE]} GPU-s)"
            )
