"""Usage alerts: when an allocation's use (charged plus reserved) crosses 50, 80 and 100 % of what it grants,
its project's managers and its tenant's admins get an in-portal notification and an e-mail, once per
threshold and allocation (an allocation is one period)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from quotas.models import Allocation, QuotaAlert
from quotas.units import format_gpu_hours
from tenants.models import ProjectRole, TenantRole
from tenants.notifications import notifications_send


def allocation_alerts_check(*, allocation_id: int) -> list[int]:
    """Announce each threshold the allocation has crossed and not yet announced; returns those announced."""
    allocation = Allocation.objects.select_related("project__tenant", "cluster").filter(pk=allocation_id).first()
    if allocation is None or allocation.granted_gpu_seconds <= 0:
        return []
    used = allocation.charged_gpu_seconds + allocation.reserved_gpu_seconds
    crossed = [
        threshold
        for threshold in sorted(settings.QUOTA_ALERT_THRESHOLDS)
        if used * 100 >= threshold * allocation.granted_gpu_seconds
    ]
    announced = set(allocation.alerts.values_list("threshold_percent", flat=True))
    new = [threshold for threshold in crossed if threshold not in announced]
    if not new:
        return []
    done: list[int] = []
    for threshold in new:
        try:
            with transaction.atomic():
                QuotaAlert.objects.create(allocation=allocation, threshold_percent=threshold, used_gpu_seconds=used)
                if threshold == new[-1]:  # one message for several thresholds crossed at once: the highest
                    _notify(allocation=allocation, threshold=threshold, used=used)
        except IntegrityError:
            continue  # a parallel check announced it
        done.append(threshold)
    return done


def _recipients(allocation: Allocation) -> list[User]:
    project = allocation.project
    return list(
        User.objects.filter(is_active=True)
        .filter(project_memberships__project=project, project_memberships__role=ProjectRole.MANAGER)
        .union(
            User.objects.filter(
                is_active=True,
                tenant_memberships__tenant=project.tenant_id,
                tenant_memberships__role=TenantRole.ADMIN,
            )
        )
    )


def _notify(*, allocation: Allocation, threshold: int, used: int) -> None:
    project = allocation.project
    kind = f" ({allocation.gpu_type} GPUs)" if allocation.gpu_type else ""
    remaining = max(allocation.remaining_gpu_seconds, 0)
    if threshold >= 100:
        title = f"{project}: GPU-hours on {allocation.cluster.name}{kind} are used up"
    else:
        title = f"{project}: {threshold}% of the GPU-hours on {allocation.cluster.name}{kind} are used"
    body = (
        f"{project} has used or reserved {format_gpu_hours(used)} of its "
        f"{format_gpu_hours(allocation.granted_gpu_seconds)} GPU-hours on cluster {allocation.cluster.name}{kind} "
        f"for {allocation.starts_on} to {allocation.ends_on}; {format_gpu_hours(remaining)} GPU-hours are left. "
        "New jobs that need more than that are refused. "
        "Members can request more hours on the allocation."
    )
    notifications_send(
        users=_recipients(allocation),
        tenant=project.tenant,
        kind="quota.threshold",
        title=title,
        body=body,
        link=f"/projects/{project.tenant.slug}/{project.slug}/allocations/{allocation.pk}/",  # the page, not the API
    )
