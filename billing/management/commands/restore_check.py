"""`manage.py restore_check`: what the portal did after a restore of its database, and what it could not rebuild.

Lists each restore it noticed (or an operator declared), each cluster's search of Slurm for the jobs the restore
lost, the jobs rebuilt from Slurm and whether each is charged and priced, the tagged Slurm jobs it could not
rebuild and why, and the draft invoices whose finalisation the lost copy of the database may have done after the
backup (numbered and sent): those stay drafts until an operator has compared them with what was sent and runs
`restore_check --reviewed`. Nothing here renumbers an invoice or charges anything.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.invoices import invoice_finalisation_due_at, invoice_number_for, invoices_held_after_restore
from billing.models import Invoice, UsageRecord
from jobs.database_restores import database_restore_declare
from jobs.models import RECOVERED_DETAIL, ClusterRecovery, DatabaseRestore, Job, JobTransition
from quotas.models import LedgerEntry, LedgerKind


class Command(BaseCommand):
    help = (
        "List what the portal rebuilt from Slurm after a restore of its database and what it could not rebuild; "
        "declare a restore it cannot notice itself (--declare-backup-after), or mark the restores reviewed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--declare-backup-after",
            metavar="TIME",
            help="Declare a restore from a backup taken after TIME (ISO 8601, UTC if no offset), e.g. after a "
            "physical or point-in-time restore, which the portal does not notice itself: Slurm is searched from then",
        )
        parser.add_argument(
            "--reviewed",
            action="store_true",
            help="Mark every restore reviewed: the held draft invoices are finalised by the periodic task again",
        )
        parser.add_argument("--by", default="", help="Who declares or reviews (recorded with the restore)")

    def handle(self, *args: Any, **options: Any) -> None:
        by = options["by"] or "manage.py restore_check"
        if options["declare_backup_after"]:
            self._declare(options["declare_backup_after"], by=by)
        if options["reviewed"]:
            count = DatabaseRestore.objects.filter(reviewed_at__isnull=True).update(
                reviewed_at=timezone.now(), reviewed_by=by
            )
            self.stdout.write(f"{count} restore(s) marked reviewed by {by}.")
        self._report()

    def _declare(self, text: str, *, by: str) -> None:
        moment = parse_datetime(text)
        if moment is None:
            raise CommandError(f"--declare-backup-after {text!r} is not a time; write e.g. 2026-11-26T09:00:00Z")
        if timezone.is_naive(moment):
            moment = moment.replace(tzinfo=UTC)
        restore = database_restore_declare(backup_after=moment, declared_by=by)
        self.stdout.write(
            f"Restore {restore.pk} declared: the workers search every cluster's Slurm from {_at(moment)}."
        )

    def _report(self) -> None:
        restores = list(DatabaseRestore.objects.order_by("detected_at", "pk"))
        if not restores:
            self.stdout.write("No restore of the database was noticed or declared.")
        for restore in restores:
            how = f"declared by {restore.declared_by}" if restore.declared_by else "noticed by the portal"
            reviewed = (
                f"reviewed {_at(restore.reviewed_at)} by {restore.reviewed_by}"
                if restore.reviewed_at
                else ("NOT REVIEWED")
            )
            self.stdout.write(
                f"Restore {restore.pk}: {how} {_at(restore.detected_at)}; backup taken after "
                f"{_at(restore.backup_after)}; {reviewed}"
            )
            existing = {
                str(job_id)
                for job_id in Job.objects.filter(pk__in=restore.undelivered_jobs).values_list("pk", flat=True)
            }
            for job_id in restore.undelivered_jobs:
                if job_id not in existing:
                    self.stdout.write(
                        f"  NOT REBUILT: job {job_id} was accepted after the backup and had not reached Slurm when the "
                        "portal stopped (only its delivery message outlived the restore): it never ran and was not "
                        "charged; its submitter must send it again"
                    )
            for recovery in ClusterRecovery.objects.filter(restore=restore).select_related("cluster"):
                state = f"finished {_at(recovery.finished_at)}" if recovery.finished_at else "still searching"
                error = f"; last error: {recovery.error}" if recovery.error else ""
                self.stdout.write(
                    f"  cluster {recovery.cluster.name}: {recovery.recovered_jobs} jobs rebuilt in "
                    f"{recovery.searches} searches, {state}{error}"
                )
                for entry in recovery.not_rebuilt:
                    self.stdout.write(
                        f"    NOT REBUILT: Slurm job {entry['slurm_job_id']} of user {entry['user']} in account "
                        f"{entry['account']} ({entry['comment']}): {entry['reason']}"
                    )
        self._recovered_jobs()
        self._invoices(restores)

    def _recovered_jobs(self) -> None:
        recovered = Job.objects.filter(
            Exists(JobTransition.objects.filter(job=OuterRef("pk"), detail__startswith=RECOVERED_DETAIL))
        ).annotate(
            charged=Exists(LedgerEntry.objects.filter(job=OuterRef("pk"), kind=LedgerKind.CHARGE)),
            priced=Exists(UsageRecord.objects.filter(job=OuterRef("pk"))),
        )
        groups = recovered.values("cluster__name", "project__slurm_account").annotate(
            jobs=Count("pk"),
            charged_jobs=Count("pk", filter=Q(charged=True)),
            priced_jobs=Count("pk", filter=Q(priced=True)),
        )
        total = 0
        for group in groups.order_by("cluster__name", "project__slurm_account"):
            total += group["jobs"]
            self.stdout.write(
                f"Rebuilt jobs on {group['cluster__name']} in account {group['project__slurm_account']}: "
                f"{group['jobs']}, {group['charged_jobs']} charged, {group['priced_jobs']} priced"
            )
        if not total:
            self.stdout.write("No job was rebuilt from Slurm.")
        waiting = recovered.filter(started_at__isnull=False, ended_at__isnull=False, gpus__gt=0, charged=False)
        for job in waiting.select_related("cluster").order_by("ended_at")[:50]:
            self.stdout.write(
                f"  ran, not charged yet: job {job.pk} (Slurm job {job.slurm_job_id} on {job.cluster.name}, "
                f"ended {_at(job.ended_at)}): its accounting record is not there yet"
            )

    def _invoices(self, restores: list[DatabaseRestore]) -> None:
        held = list(invoices_held_after_restore())
        for invoice in held:
            due = invoice_finalisation_due_at(invoice.month)
            self.stdout.write(
                f"HELD: draft invoice {invoice.pk} of {invoice.tenant.slug} for {invoice.month:%Y-%m} "
                f"({invoice.total} {invoice.currency}): its finalisation was due {_at(due)}, "
                f"before the restore was noticed, so the lost copy may have finalised and sent it; finalised now it "
                f"would be {invoice_number_for(invoice)}; compare it with what was sent, then run "
                "restore_check --reviewed."
            )
        if restores:
            highest = Invoice.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            since = restores[-1].backup_after
            self.stdout.write(
                f"Invoices made after {_at(since)} are not in the restored database: any invoice numbered after "
                f"invoice id {highest} (INV-YYYYMM-{highest:06d}) that was sent is lost here and must be checked by "
                "hand; the portal never numbers an invoice again on its own."
            )


def _at(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment is not None else "never"
