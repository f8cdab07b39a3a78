"""What the restore drills share: a backup of the drill's database with `pg_dump`, its restore with `pg_restore`
while the portal is stopped, the wait for a complete ledger, and a reconciliation report that must find nothing.

A complete ledger: every job the client had accepted is in the portal and final, each that ran is charged once
in the quota ledger and priced once by billing (its usage record), and no cluster's recovery is still searching.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import portal_stack as stack  # as harness set it up (drills import harness first)
from django.db import connections
from django.db.models import Exists, OuterRef
from django.utils import timezone
from harness import Drill

from billing.models import Rate, ReconciliationReport, UsageRecord
from billing.rates import rate_create
from billing.reconciliation import reconciliation_report_run
from jobs.models import FINAL_JOB_STATES, RECOVERED_DETAIL, ClusterRecovery, DatabaseRestore, Job, JobTransition
from quotas.models import LedgerEntry, LedgerKind

PRICE_PER_GPU_HOUR = Decimal("1.80")


def rate_ensure(drill: Drill) -> None:
    """A price for the cluster's GPUs from before the drill, so that billing prices every charge."""
    if not Rate.objects.filter(cluster=drill.world.cluster).exists():
        rate_create(
            actor=None,
            cluster=drill.world.cluster,
            gpu_type="",
            price_per_gpu_hour=PRICE_PER_GPU_HOUR,
            currency="EUR",
            valid_from=timezone.now() - timedelta(days=1),
        )


def backup(drill: Drill) -> Path:
    """`pg_dump` of the drill's database, in PostgreSQL's custom format, as a site's nightly backup."""
    path = Path(tempfile.mkdtemp(prefix="gpuportal-drill-backup-")) / "portal.dump"
    started = time.monotonic()
    subprocess.run(  # noqa: S603 -- PostgreSQL's own tool, with fixed arguments
        ["pg_dump", "--format=custom", f"--file={path}", stack.DATABASE_URL],  # noqa: S607
        check=True,
        timeout=300,
    )
    drill.say(
        f"backup taken: pg_dump to {path} ({path.stat().st_size // 1024} KiB, {time.monotonic() - started:.1f} s)"
    )
    return path


def restore(drill: Drill, path: Path) -> None:
    """Stop the portal, restore the backup over the drill's database (`pg_restore --clean`), start the portal."""
    drill.portal.stop()
    drill.say("portal stopped (web servers, worker, beat)")
    connections.close_all()
    started = time.monotonic()
    subprocess.run(  # noqa: S603 -- PostgreSQL's own tool, with fixed arguments
        ["pg_restore", "--clean", "--if-exists", "--no-owner", f"--dbname={stack.DATABASE_URL}", str(path)],  # noqa: S607
        check=True,
        timeout=600,
    )
    drill.say(f"backup restored with pg_restore --clean in {time.monotonic() - started:.1f} s")
    drill.portal.run_dir.mkdir(mode=0o711, exist_ok=True)
    drill.portal.run_dir.chmod(0o711)
    drill.portal.start()
    drill.say("portal started again on the restored database")


@dataclass(frozen=True)
class Completeness:
    missing: int  # accepted by the portal, not in the database
    not_final: int
    uncharged: int  # ran, no charge in the quota ledger
    unpriced: int  # charged, no usage record

    @property
    def complete(self) -> bool:
        return not (self.missing or self.not_final or self.uncharged or self.unpriced)

    def __str__(self) -> str:
        return (
            f"{self.missing} accepted jobs missing, {self.not_final} not final, {self.uncharged} ran but uncharged, "
            f"{self.unpriced} charged but unpriced"
        )


def completeness(drill: Drill, job_ids: Collection[str]) -> Completeness:
    """How far the ledger is from complete; accepted jobs the portal recorded as lost before delivery (see
    `DatabaseRestore.undelivered_jobs`) are not waited for."""
    never_delivered = {job_id for restore in DatabaseRestore.objects.all() for job_id in restore.undelivered_jobs}
    jobs = Job.objects.filter(project=drill.world.project).annotate(
        charged=Exists(LedgerEntry.objects.filter(job=OuterRef("pk"), kind=LedgerKind.CHARGE)),
        priced=Exists(UsageRecord.objects.filter(job=OuterRef("pk"))),
    )
    rows = list(jobs.values_list("pk", "state", "started_at", "gpus", "charged", "priced"))
    present = {str(row[0]) for row in rows}
    ran = [row for row in rows if row[2] is not None and row[3] > 0]
    return Completeness(
        missing=len(set(job_ids) - present - never_delivered),
        not_final=sum(1 for row in rows if row[1] not in FINAL_JOB_STATES),
        uncharged=sum(1 for row in ran if not row[4]),
        unpriced=sum(1 for row in ran if row[4] and not row[5]),
    )


def wait_complete(drill: Drill, job_ids: Collection[str], *, timeout_seconds: float = 600) -> float:
    """Wait until the ledger is complete (see the module's doc); the seconds it took. Says how far it got."""
    started = time.monotonic()
    said = 0.0
    while True:
        state = completeness(drill, job_ids)
        waited = time.monotonic() - started
        if state.complete:
            return waited
        if waited > timeout_seconds:
            drill.say(f"gave up waiting for a complete ledger after {waited:.0f} s: {state}")
            return waited
        if waited - said >= 10:
            said = waited
            drill.say(f"waiting for a complete ledger: {state}")
        time.sleep(0.25)


def recovery_summary(drill: Drill) -> None:
    for restore in DatabaseRestore.objects.order_by("detected_at"):
        drill.say(
            f"restore noticed by the portal at {restore.detected_at:%H:%M:%S} "
            f"(backup after {restore.backup_after:%H:%M:%S})"
        )
        if restore.undelivered_jobs:
            drill.say(
                f"  {len(restore.undelivered_jobs)} accepted jobs had not reached Slurm when the portal stopped: "
                "recorded as lost before delivery (a delivery message outlived the restore)"
            )
        for recovery in ClusterRecovery.objects.filter(restore=restore).select_related("cluster"):
            drill.say(
                f"  cluster {recovery.cluster.name}: {recovery.recovered_jobs} jobs rebuilt by its searches "
                f"({recovery.searches}), {len(recovery.not_rebuilt)} not rebuilt"
            )
    rebuilt = Job.objects.filter(
        project=drill.world.project,
        pk__in=JobTransition.objects.filter(detail__startswith=RECOVERED_DETAIL).values("job_id"),
    ).count()
    drill.say(f"{rebuilt} jobs of the project carry '{RECOVERED_DETAIL}' in their timeline")


def reconciliation_clean(drill: Drill) -> bool:
    """A reconciliation report of the drill's period on its cluster: whether it found no difference at all."""
    report = ReconciliationReport.objects.create(
        cluster=drill.world.cluster, period_start=drill.started_at - timedelta(minutes=5), period_end=timezone.now()
    )
    report = reconciliation_report_run(report_id=report.pk, client=drill.slurm)
    summary = report.summary
    print(
        f"  reconciliation report {report.pk}: {report.state}; portal {summary.get('portal_jobs')} jobs, "
        f"{summary.get('portal_gpu_seconds')} GPU-s; Slurm {summary.get('slurm_jobs')} jobs, "
        f"{summary.get('slurm_gpu_seconds')} GPU-s; difference {summary.get('difference_gpu_seconds')} GPU-s; "
        f"findings {summary.get('counts')}",
        flush=True,
    )
    for finding in report.findings[:5]:
        print(f"    finding: {finding['detail']}", flush=True)
    return report.state == "done" and summary.get("findings_total") == 0 and summary.get("difference_gpu_seconds") == 0
