"""A project's idle-GPU policy as its managers and tenant admins read and change it (browser and API alike)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from jobs.models import ProjectEfficiencyPolicy
from tenants.models import Project
from tenants.services import Actor, audit_record

# Below a quarter of an hour a job is ended about as soon as the cluster flags it idle, which leaves its owner no
# time to answer the warning; beyond a week the limit outlasts every partition's time limit here.
END_AFTER_IDLE_MINUTES_MIN = 15
END_AFTER_IDLE_MINUTES_MAX = 7 * 24 * 60


def efficiency_policy_of(*, project: Project) -> ProjectEfficiencyPolicy:
    """The project's policy; an unsaved one with the defaults (nobody else told, nothing ended) if it has none."""
    return ProjectEfficiencyPolicy.objects.filter(project=project).first() or ProjectEfficiencyPolicy(project=project)


def efficiency_policy_values(policy: ProjectEfficiencyPolicy) -> dict[str, Any]:
    """The policy as its editors see it (minutes), for the pages, the API and the audit log."""
    return {
        "notify_managers": policy.notify_managers,
        "end_idle_jobs": policy.end_idle_jobs,
        "end_after_idle_minutes": policy.end_after_idle_seconds // 60,
        "warning_minutes": policy.warning_seconds // 60,
    }


@transaction.atomic
def efficiency_policy_update(
    *,
    actor: Actor,
    project: Project,
    notify_managers: bool | None = None,
    end_idle_jobs: bool | None = None,
    end_after_idle_minutes: int | None = None,
    warning_minutes: int | None = None,
) -> ProjectEfficiencyPolicy:
    """Change the fields given (None leaves one as it is); the change and its audit event in one transaction.
    Nothing is written, not even the default row, when nothing changes."""
    # The project's row serialises two first changes, which would otherwise both create the policy's row.
    Project.objects.select_for_update(of=("self",), no_key=True).filter(pk=project.pk).first()
    policy = ProjectEfficiencyPolicy.objects.select_for_update(of=("self",)).filter(project=project).first()
    policy = policy or ProjectEfficiencyPolicy(project=project)
    before = efficiency_policy_values(policy)
    if notify_managers is not None:
        policy.notify_managers = notify_managers
    if end_idle_jobs is not None:
        policy.end_idle_jobs = end_idle_jobs
    if end_after_idle_minutes is not None:
        if not END_AFTER_IDLE_MINUTES_MIN <= end_after_idle_minutes <= END_AFTER_IDLE_MINUTES_MAX:
            raise ValidationError(
                {
                    "end_after_idle_minutes": [
                        f"Give between {END_AFTER_IDLE_MINUTES_MIN} and {END_AFTER_IDLE_MINUTES_MAX} minutes "
                        f"(a week); you gave {end_after_idle_minutes}."
                    ]
                }
            )
        policy.end_after_idle_seconds = end_after_idle_minutes * 60
    if warning_minutes is not None:
        policy.warning_seconds = warning_minutes * 60
    if not 0 <= policy.warning_seconds < policy.end_after_idle_seconds:
        raise ValidationError(
            {
                "warning_minutes": [
                    f"The warning must come before the end: give 0 to {policy.end_after_idle_seconds // 60 - 1} "
                    f"minutes; you gave {policy.warning_seconds // 60}."
                ]
            }
        )
    after = efficiency_policy_values(policy)
    if after != before:
        policy.save()
        audit_record(
            actor=actor,
            action="project.efficiency_policy_updated",
            target=policy,
            tenant=project.tenant,
            before=before,
            after=after,
        )
    return policy
