"""Requests for more GPU-hours on an allocation, their decisions, and the tenant pools tenant admins grant from.

Portal admins approve any amount. Tenant admins approve for their tenant's projects by drawing on a pool a
portal admin gave the tenant on that cluster for a period covering the allocation's; the pool row is locked
while it is drawn on, so two approvals at once cannot hand out more than it holds.
"""

from __future__ import annotations

import enum
from datetime import date
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from portal.errors import Conflict
from quotas.models import Allocation, QuotaRequest, QuotaRequestState, TenantPool
from quotas.services import allocation_grant
from quotas.units import format_gpu_hours, gpu_hours_to_seconds
from tenants.models import Tenant, TenantRole
from tenants.notifications import notifications_send
from tenants.selectors import (
    AnyUser,
    administered_by,
    is_portal_admin,
    project_get_for_user,
    tenant_role_of,
    visible_to,
)
from tenants.services import audit_record

if TYPE_CHECKING:
    from clusters.models import Cluster


def quota_request_path(request: QuotaRequest) -> str:
    return f"/api/v1/quota-requests/{request.pk}/"


def _allocation_page(allocation: Allocation) -> str:
    project = allocation.project
    return f"/projects/{project.tenant.slug}/{project.slug}/allocations/{allocation.pk}/"


def _request_state(request: QuotaRequest) -> dict[str, Any]:
    return {
        "allocation": request.allocation_id,
        "requested_by": request.requested_by.get_username(),
        "requested_gpu_seconds": request.requested_gpu_seconds,
        "state": request.state,
        "granted_gpu_seconds": request.granted_gpu_seconds,
        "decision_reason": request.decision_reason,
    }


def _label(allocation: Allocation) -> str:
    kind = f" ({allocation.gpu_type} GPUs)" if allocation.gpu_type else ""
    return (
        f"{allocation.project} on cluster {allocation.cluster.name}{kind} "
        f"for {allocation.starts_on} to {allocation.ends_on}"
    )


def _deciders(tenant: Tenant) -> QuerySet[User]:
    """Who may decide a request of this tenant: its admins and the portal admins."""
    return User.objects.filter(is_active=True).filter(
        Q(is_staff=True) | Q(tenant_memberships__tenant=tenant, tenant_memberships__role=TenantRole.ADMIN)
    )


# Asking ------------------------------------------------------------------------------------------------


def quota_request_problems(*, gpu_hours: Decimal | None, justification: str) -> dict[str, list[str]]:
    """Every problem of a request's fields, per field; `gpu_hours` None: a form could not read it (and says so),
    the justification is still checked, so that both errors show at once."""
    problems: dict[str, list[str]] = {}
    if gpu_hours is not None and gpu_hours_to_seconds(gpu_hours) <= 0:
        problems["gpu_hours"] = ["Ask for more than 0 GPU-hours, e.g. 20 or 12.5."]
    if not justification.strip():
        problems["justification"] = ["Say what the hours are for, so that an admin can decide."]
    return problems


def quota_request_create(
    *, actor: User, allocation: Allocation, gpu_hours: Decimal, justification: str
) -> QuotaRequest:
    """Ask for more GPU-hours on an allocation. The caller has checked that `actor` may submit jobs in its
    project (members and managers); the tenant's admins and the portal admins are told."""
    justification = justification.strip()
    problems = quota_request_problems(gpu_hours=gpu_hours, justification=justification)
    if problems:
        raise ValidationError(problems)
    gpu_seconds = gpu_hours_to_seconds(gpu_hours)
    if allocation.ends_on < timezone.now().date():
        raise Conflict(
            f"This allocation ended on {allocation.ends_on}; ask for hours on the project's current allocation "
            "(GET /api/v1/allocations/)."
        )
    with transaction.atomic():
        request = QuotaRequest.objects.create(
            allocation=allocation, requested_by=actor, requested_gpu_seconds=gpu_seconds, justification=justification
        )
        audit_record(
            actor=actor,
            action="quota_request.create",
            target=request,
            tenant=allocation.project.tenant,
            before=None,
            after={**_request_state(request), "justification": justification},
        )
        notifications_send(
            users=_deciders(allocation.project.tenant).exclude(pk=actor.pk),  # not the asker, if an admin
            tenant=allocation.project.tenant,
            kind="quota.request",
            title=f"{allocation.project}: {actor.get_username()} asks for {format_gpu_hours(gpu_seconds)} GPU-hours",
            body=(
                f"{actor.get_username()} asks for {format_gpu_hours(gpu_seconds)} more GPU-hours on "
                f"{_label(allocation)}: {justification}"
            ),
            link=f"/requests/{request.pk}/",  # the deciders' page, not the API
        )
    return request


def quota_request_withdraw(*, actor: User, request: QuotaRequest) -> QuotaRequest:
    """The requester takes back their own pending request."""
    if request.requested_by_id != actor.pk:
        raise PermissionDenied("Only the member who asked may withdraw a request.")
    with transaction.atomic():
        locked = (
            QuotaRequest.objects.select_for_update(of=("self",), no_key=True)
            .select_related("allocation__project__tenant")
            .get(pk=request.pk)
        )
        _ensure_pending(locked)
        before = _request_state(locked)
        locked.state = QuotaRequestState.WITHDRAWN
        locked.decided_by = actor
        locked.decided_at = timezone.now()
        locked.save(update_fields=["state", "decided_by", "decided_at"])
        audit_record(
            actor=actor,
            action="quota_request.withdraw",
            target=locked,
            tenant=locked.allocation.project.tenant,
            before=before,
            after=_request_state(locked),
        )
    return locked


def _ensure_pending(request: QuotaRequest) -> None:
    if request.state != QuotaRequestState.PENDING:
        raise Conflict(
            f"Request {request.pk} is {QuotaRequestState(request.state).label.lower()} already; only pending requests "
            "can be decided or withdrawn. Ask again with a new request."
        )


# Deciding ----------------------------------------------------------------------------------------------


def _may_decide(*, user: AnyUser, tenant: Tenant) -> bool:
    return is_portal_admin(user) or tenant_role_of(user=user, tenant=tenant) == TenantRole.ADMIN


def quota_request_decide(
    *, actor: User, request: QuotaRequest, approve_gpu_hours: Decimal | None, reason: str
) -> QuotaRequest:
    """Approve a pending request in full or in part (the hours are granted at once), or deny it with a reason
    (`approve_gpu_hours` None or 0). Tenant admins draw what they grant from their tenant's pool."""
    tenant = request.allocation.project.tenant
    if not _may_decide(user=actor, tenant=tenant):
        raise PermissionDenied(
            f"Deciding a request needs the tenant role 'admin' in tenant '{tenant.slug}', or a portal admin."
        )
    reason = reason.strip()
    approve_seconds = gpu_hours_to_seconds(approve_gpu_hours) if approve_gpu_hours is not None else 0
    if approve_seconds < 0:
        raise ValidationError({"approve_gpu_hours": ["Give the GPU-hours to grant (more than 0), or null to deny."]})
    if approve_seconds == 0 and not reason:
        raise ValidationError({"reason": ["Say why the request is denied; the requester reads it."]})
    if approve_seconds > request.requested_gpu_seconds:
        raise ValidationError(
            {
                "approve_gpu_hours": [
                    f"Approve at most the {format_gpu_hours(request.requested_gpu_seconds)} GPU-hours requested; "
                    "grant more on the allocation itself."
                ]
            }
        )
    with transaction.atomic():
        locked = (
            QuotaRequest.objects.select_for_update(of=("self",), no_key=True)
            .select_related("allocation__project__tenant", "allocation__cluster", "requested_by")
            .get(pk=request.pk)
        )
        _ensure_pending(locked)
        before = _request_state(locked)
        allocation = locked.allocation
        pool: TenantPool | None = None
        if approve_seconds > 0:
            if allocation.ends_on < timezone.now().date():
                raise Conflict(
                    f"This allocation ended on {allocation.ends_on}: hours granted now could not be used. Deny the "
                    "request and grant on the project's current allocation instead."
                )
            if not is_portal_admin(actor):
                pool = _pool_draw(allocation=allocation, gpu_seconds=approve_seconds)
            allocation = allocation_grant(
                actor=actor, allocation=allocation, gpu_seconds=approve_seconds, note=f"request {locked.pk}"
            )
            full = approve_seconds == locked.requested_gpu_seconds
            locked.state = QuotaRequestState.APPROVED if full else QuotaRequestState.PARTIALLY_APPROVED
        else:
            locked.state = QuotaRequestState.DENIED
        locked.granted_gpu_seconds = approve_seconds
        locked.decided_by = actor
        locked.decided_at = timezone.now()
        locked.decision_reason = reason
        locked.save(update_fields=["state", "granted_gpu_seconds", "decided_by", "decided_at", "decision_reason"])
        after: dict[str, Any] = _request_state(locked)
        if pool is not None:
            after["tenant_pool"] = pool.pk
            after["tenant_pool_available_gpu_seconds"] = pool.available_gpu_seconds
        audit_record(
            actor=actor,
            action="quota_request.deny" if approve_seconds == 0 else "quota_request.approve",
            target=locked,
            tenant=tenant,
            before=before,
            after=after,
        )
        _notify_requester(request=locked, allocation=allocation)
    return locked


def _pool_draw(*, allocation: Allocation, gpu_seconds: int) -> TenantPool:
    """Take GPU-seconds from the tenant's pool covering the allocation's period, under the pool's lock."""
    tenant = allocation.project.tenant
    pool = (
        TenantPool.objects.select_for_update(of=("self",), no_key=True)
        .filter(
            tenant=tenant,
            cluster_id=allocation.cluster_id,
            starts_on__lte=allocation.starts_on,
            ends_on__gte=allocation.ends_on,
        )
        .order_by("starts_on")
        .first()
    )
    if pool is None:
        raise Conflict(
            f"Tenant '{tenant.slug}' has no pool of GPU-hours on cluster {allocation.cluster.name} covering "
            f"{allocation.starts_on} to {allocation.ends_on} to approve from; ask a portal admin to approve this "
            "request, or to give the tenant a pool.",
            code="pool_exhausted",
        )
    if pool.available_gpu_seconds < gpu_seconds:
        left = max(pool.available_gpu_seconds, 0)
        raise Conflict(
            f"Tenant '{tenant.slug}''s pool on cluster {allocation.cluster.name} for {pool.starts_on} to "
            f"{pool.ends_on} has {format_gpu_hours(left)} GPU-hours left, less than the "
            f"{format_gpu_hours(gpu_seconds)} to approve; approve at most {format_gpu_hours(left)}, or ask a "
            "portal admin.",
            code="pool_exhausted",
        )
    pool.distributed_gpu_seconds = F("distributed_gpu_seconds") + gpu_seconds
    pool.save(update_fields=["distributed_gpu_seconds"])
    pool.refresh_from_db(fields=["distributed_gpu_seconds"])
    return pool


def _notify_requester(*, request: QuotaRequest, allocation: Allocation) -> None:
    requested = format_gpu_hours(request.requested_gpu_seconds)
    who = request.decided_by.get_username() if request.decided_by else "an admin"
    because = f" Reason: {request.decision_reason}" if request.decision_reason else ""
    if request.state == QuotaRequestState.DENIED:
        title = f"{allocation.project}: your request for {requested} GPU-hours was denied"
        body = f"{who} denied your request for {requested} GPU-hours on {_label(allocation)}.{because}"
    else:
        granted = format_gpu_hours(request.granted_gpu_seconds)
        in_part = " in part" if request.state == QuotaRequestState.PARTIALLY_APPROVED else ""
        title = f"{allocation.project}: your request was approved{in_part}: {granted} of {requested} GPU-hours"
        body = (
            f"{who} approved{in_part} your request on {_label(allocation)}: {granted} of {requested} GPU-hours "
            f"granted; {format_gpu_hours(max(allocation.remaining_gpu_seconds, 0))} GPU-hours are left now.{because}"
        )
    notifications_send(
        users=[request.requested_by],
        tenant=allocation.project.tenant,
        kind="quota.request_decided",
        title=title,
        body=body,
        link=_allocation_page(allocation),  # where the asker sees the request and the hours
    )


# Tenant pools ------------------------------------------------------------------------------------------


def tenant_pool_create(
    *, actor: User, tenant: Tenant, cluster: Cluster, gpu_hours: Decimal, starts_on: date, ends_on: date
) -> TenantPool:
    """A portal admin gives a tenant GPU-hours on a cluster for a period, for its admins to approve from."""
    if not is_portal_admin(actor):
        raise PermissionDenied("Giving a tenant a pool of GPU-hours needs a portal admin.")
    gpu_seconds = gpu_hours_to_seconds(gpu_hours)
    problems: dict[str, list[str]] = {}
    if gpu_seconds <= 0:
        problems["gpu_hours"] = ["Give the pool more than 0 GPU-hours."]
    if ends_on < starts_on:
        problems["ends_on"] = [f"The period ends ({ends_on}) before it starts ({starts_on}); swap the dates."]
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        # Serialises pool changes of one tenant, so two overlapping pools cannot both get in.
        Tenant.objects.select_for_update(of=("self",), no_key=True).filter(pk=tenant.pk).first()
        overlapping = TenantPool.objects.filter(
            tenant=tenant, cluster=cluster, starts_on__lte=ends_on, ends_on__gte=starts_on
        ).first()
        if overlapping is not None:
            raise Conflict(
                f"Tenant '{tenant.slug}' already has a pool on cluster {cluster.name} from {overlapping.starts_on} "
                f"to {overlapping.ends_on}, which overlaps {starts_on}..{ends_on}; choose a period after it."
            )
        pool = TenantPool.objects.create(
            tenant=tenant,
            cluster=cluster,
            starts_on=starts_on,
            ends_on=ends_on,
            gpu_seconds=gpu_seconds,
            created_by=actor,
        )
        audit_record(
            actor=actor,
            action="tenant_pool.create",
            target=pool,
            tenant=tenant,
            before=None,
            after={
                "cluster": cluster.name,
                "starts_on": starts_on.isoformat(),
                "ends_on": ends_on.isoformat(),
                "gpu_seconds": gpu_seconds,
            },
        )
    return pool


# Reads and access --------------------------------------------------------------------------------------


class QuotaRequestAction(enum.Enum):
    VIEW = "view"  # who sees the allocation: project members of any role, tenant admins, portal admins
    DECIDE = "decide"  # tenant admins of the allocation's tenant, portal admins
    WITHDRAW = "withdraw"  # the requester


def quota_request_list_for_user(*, user: AnyUser) -> QuerySet[QuotaRequest]:
    """Requests on the allocations the user may see, newest first."""
    requests = QuotaRequest.objects.select_related(
        "allocation__project__tenant", "allocation__cluster", "requested_by", "decided_by"
    ).order_by("-created_at", "-id")
    return visible_to(requests, user=user, project_field="allocation__project")


def quota_request_pending_to_decide_for_user(*, user: AnyUser) -> QuerySet[QuotaRequest]:
    """Pending requests the user may decide: every one for portal admins, those of the tenants they administer
    for tenant admins, none for anyone else (the navigation's count, the decision queue)."""
    pending = quota_request_list_for_user(user=user).filter(state=QuotaRequestState.PENDING)
    return administered_by(pending, user=user, tenant_field="allocation__project__tenant")


def quota_request_get_for_user(
    *, user: AnyUser, request_id: int, action: QuotaRequestAction = QuotaRequestAction.VIEW
) -> QuotaRequest:
    """The request if `user` may do `action` on it: 404 for users outside its tenant (worded as for a request
    that does not exist), 403 for a role too low, as for its project."""
    request = (
        QuotaRequest.objects.select_related(
            "allocation__project__tenant", "allocation__cluster", "requested_by", "decided_by"
        )
        .filter(pk=request_id)
        .first()
    )
    not_found = Http404(
        f"No quota request {request_id} exists among the ones you can see; list yours with GET /api/v1/quota-requests/."
    )
    if request is None:
        raise not_found
    project = request.allocation.project
    try:
        project_get_for_user(user=user, tenant_slug=project.tenant.slug, project_slug=project.slug)
    except Http404:
        raise not_found from None
    if action is QuotaRequestAction.DECIDE and not _may_decide(user=user, tenant=project.tenant):
        raise PermissionDenied(
            f"Deciding a request needs the tenant role 'admin' in tenant '{project.tenant.slug}', or a portal admin; "
            "ask one of the tenant's admins."
        )
    if action is QuotaRequestAction.WITHDRAW and request.requested_by_id != user.pk:
        raise PermissionDenied(
            f"Only {request.requested_by.get_username()}, who asked, may withdraw this request; admins deny it instead."
        )
    return request


def tenant_pool_list_for_user(*, user: AnyUser) -> QuerySet[TenantPool]:
    """Pools of the tenants the user administers (all of them for portal admins)."""
    pools = TenantPool.objects.select_related("tenant", "cluster").order_by(
        "tenant__slug", "cluster__name", "-starts_on"
    )
    return administered_by(pools, user=user)
