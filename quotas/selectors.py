"""Reads of allocations, their ledger and requests, and the access helper every quota route goes through.

Who sees an allocation is who sees its project (`project_get_for_user`): members of any role, the tenant's
admins and portal admins; anyone else gets the same 404 as for an allocation that does not exist.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from quotas.models import Allocation, LedgerEntry
from tenants.selectors import AnyUser, ProjectAction, project_get_for_user, visible_to


def allocation_list_for_user(*, user: AnyUser) -> QuerySet[Allocation]:
    """Allocations of the projects the user may view, newest period first."""
    allocations = Allocation.objects.select_related("project__tenant", "cluster").order_by(
        "project__tenant__slug", "project__slug", "cluster__name", "gpu_type", "-starts_on"
    )
    return visible_to(allocations, user=user)


def allocation_get_for_user(
    *, user: AnyUser, allocation_id: int, action: ProjectAction = ProjectAction.VIEW
) -> Allocation:
    """The allocation if `user` may do `action` on its project: 404 for outsiders, 403 for a role too low."""
    allocation = Allocation.objects.select_related("project__tenant", "cluster").filter(pk=allocation_id).first()
    if allocation is None:
        raise _not_found(allocation_id)
    try:
        project_get_for_user(
            user=user,
            tenant_slug=allocation.project.tenant.slug,
            project_slug=allocation.project.slug,
            action=action,
        )
    except Http404:
        raise _not_found(allocation_id) from None
    except PermissionDenied:
        raise
    return allocation


def _not_found(allocation_id: int) -> Http404:
    return Http404(
        f"No allocation {allocation_id} exists among the ones you can see; list yours with GET /api/v1/allocations/."
    )


def allocation_ledger(*, allocation: Allocation) -> QuerySet[LedgerEntry]:
    return allocation.ledger_entries.select_related("job", "actor").order_by("id")
