"""Django admin for reconciliation reports: request one for a cluster and period, read its findings as a table.

Imported by billing/admin.py. A report is written by the workers only; the add form asks for one through the
same service as the API, and the action asks again for the periods of the selected reports.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from billing.models import ReconciliationKind, ReconciliationReport
from billing.reconciliation import reconciliation_period_validate, reconciliation_report_request

# The service names the API's fields; the form's are the model's.
_FORM_FIELDS = {"start": "period_start", "end": "period_end"}


class ReconciliationRequestForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = ReconciliationReport
        fields = ("cluster", "period_start", "period_end")
        help_texts = {
            "period_start": "UTC. The report covers the jobs that ended from this moment on…",
            "period_end": "…until this moment (exclusive); at most 92 days later, and not in the future.",
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("period_start") and cleaned.get("period_end"):
            try:
                reconciliation_period_validate(period_start=cleaned["period_start"], period_end=cleaned["period_end"])
            except ValidationError as exc:
                for field, problems in exc.message_dict.items():
                    for problem in problems:
                        self.add_error(_FORM_FIELDS.get(field), problem)
        return cleaned


def _kind_label(kind: str) -> str:
    return ReconciliationKind(kind).label if kind in ReconciliationKind.values else kind


def _count(report: ReconciliationReport, kind: ReconciliationKind) -> int | None:
    counts = report.summary.get("counts") if isinstance(report.summary, dict) else None
    return counts.get(kind.value, 0) if isinstance(counts, dict) else None


@admin.register(ReconciliationReport)
class ReconciliationReportAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "cluster",
        "period_start",
        "period_end",
        "state",
        "jobs_compared",
        "missing_in_slurm",
        "missing_in_portal",
        "gpu_seconds_differ",
        "unpriced",
        "difference_gpu_hours",
        "created_at",
    )
    list_filter = ("cluster", "state")
    list_select_related = ("cluster",)
    date_hierarchy = "period_end"
    actions = ("request_again",)
    form = ReconciliationRequestForm
    detail_fields = (
        "cluster",
        "period_start",
        "period_end",
        "state",
        "requested_by",
        "created_at",
        "started_at",
        "finished_at",
        "error",
        "summary_table",
        "findings_table",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReconciliationReport]:
        return super().get_queryset(request).select_related("requested_by")

    # Adding asks a worker for a report; nothing of a report is ever edited.

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self.detail_fields if obj is not None else ReconciliationRequestForm.Meta.fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self.detail_fields if obj is not None else ()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ReconciliationReport, form: Any, change: bool) -> None:
        report = reconciliation_report_request(
            actor=request.user,
            cluster=obj.cluster,
            period_start=obj.period_start,
            period_end=obj.period_end,
        )
        # The admin goes on to log the addition and redirect to the object it was handed.
        obj.pk = report.pk
        obj.state = report.state
        obj.created_at = report.created_at

    @admin.action(description="Request a new report for the same cluster and period")
    def request_again(self, request: HttpRequest, queryset: QuerySet[ReconciliationReport]) -> None:
        asked = 0
        for report in queryset.select_related("cluster"):
            try:
                reconciliation_report_request(
                    actor=request.user,
                    cluster=report.cluster,
                    period_start=report.period_start,
                    period_end=report.period_end,
                )
                asked += 1
            except ValidationError as exc:
                self.message_user(request, f"Report {report.pk}: {' '.join(exc.messages)}", messages.WARNING)
        if asked:
            self.message_user(
                request, f"Asked the workers for {asked} new report(s); they appear here as pending.", messages.SUCCESS
            )

    # Columns and read-only blocks.

    @admin.display(description="Compared")
    def jobs_compared(self, report: ReconciliationReport) -> int | None:
        value = report.summary.get("jobs_compared") if isinstance(report.summary, dict) else None
        return value if isinstance(value, int) else None

    @admin.display(description="Missing in Slurm")
    def missing_in_slurm(self, report: ReconciliationReport) -> int | None:
        return _count(report, ReconciliationKind.MISSING_IN_SLURM)

    @admin.display(description="Missing in portal")
    def missing_in_portal(self, report: ReconciliationReport) -> int | None:
        return _count(report, ReconciliationKind.MISSING_IN_PORTAL)

    @admin.display(description="GPU-s differ")
    def gpu_seconds_differ(self, report: ReconciliationReport) -> int | None:
        return _count(report, ReconciliationKind.GPU_SECONDS_DIFFER)

    @admin.display(description="Unpriced")
    def unpriced(self, report: ReconciliationReport) -> int | None:
        return _count(report, ReconciliationKind.UNPRICED)

    @admin.display(description="Portal minus Slurm (GPU-h)")
    def difference_gpu_hours(self, report: ReconciliationReport) -> str:
        return str(report.summary.get("difference_gpu_hours", "")) if isinstance(report.summary, dict) else ""

    @admin.display(description="Summary")
    def summary_table(self, report: ReconciliationReport) -> SafeString:
        summary = report.summary if isinstance(report.summary, dict) else {}
        if not summary:
            return format_html("<p>{}</p>", "Not computed: the report is " + report.get_state_display().lower() + ".")
        rows = [
            ("Slurm accounts asked", summary.get("accounts")),
            ("Portal jobs", summary.get("portal_jobs")),
            ("Slurm jobs", summary.get("slurm_jobs")),
            ("Jobs in both", summary.get("jobs_compared")),
            (
                "Portal GPU-hours (GPU-seconds)",
                f"{summary.get('portal_gpu_hours')} ({summary.get('portal_gpu_seconds')})",
            ),
            ("Slurm GPU-hours (GPU-seconds)", f"{summary.get('slurm_gpu_hours')} ({summary.get('slurm_gpu_seconds')})"),
            (
                "Portal minus Slurm, GPU-hours (GPU-seconds)",
                f"{summary.get('difference_gpu_hours')} ({summary.get('difference_gpu_seconds')})",
            ),
            *((_kind_label(kind), count) for kind, count in (summary.get("counts") or {}).items()),
        ]
        if summary.get("findings_truncated"):
            rows.append(
                ("Findings kept", f"the first {summary.get('findings_stored')} of {summary.get('findings_total')}")
            )
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html("<table><tbody>{}</tbody></table>", body)

    @admin.display(description="Findings")
    def findings_table(self, report: ReconciliationReport) -> SafeString:
        if not report.findings:
            if report.state == "done":
                return format_html("<p>{}</p>", "None: the portal and Slurm's accounting agree on every job.")
            return format_html("<p>{}</p>", "None yet.")
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _kind_label(finding.get("kind", "")),
                    finding.get("slurm_job_id") or "",
                    finding.get("account", ""),
                    finding.get("job") or "",
                    "" if finding.get("portal_gpu_seconds") is None else finding["portal_gpu_seconds"],
                    "" if finding.get("slurm_gpu_seconds") is None else finding["slurm_gpu_seconds"],
                    finding.get("detail", ""),
                )
                for finding in report.findings
            ),
        )
        return format_html(
            "<table><thead><tr><th>Kind</th><th>Slurm job</th><th>Account</th><th>Portal job</th>"
            "<th>Portal GPU-s</th><th>Slurm GPU-s</th><th>Detail</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )
