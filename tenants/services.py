"""Writes to tenants, projects, memberships and tokens. Each runs in one transaction with its audit event.

Callers check permissions through `tenants.selectors` first; these services enforce the rules that hold
whoever calls them (a project member must belong to the tenant, a tenant keeps at least one admin, ...).
Slurm is never called here: changes that Slurm must follow schedule a Celery task once they commit.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.db.models import Model
from django.utils import timezone

from portal.channel_sends import group_send_all
from portal.db import insert_prepared, prepared_cursor
from portal.queue import task_enqueue_on_commit
from portal.request_ids import current_request_id
from tenants.models import (
    SLUG_MESSAGE,
    ApiToken,
    AuditEvent,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
    slug_validator,
)
from tenants.slurm_names import project_account_name, tenant_parent_account_name

logger = logging.getLogger(__name__)

Actor = User | AnonymousUser | None

TOKEN_PREFIX = "gpp_"
TOKEN_NAME_MAX_LENGTH = 100


# Audit -------------------------------------------------------------------------------------------------


def audit_record(
    *,
    actor: Actor,
    action: str,
    target: Model,
    tenant: Tenant | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditEvent:
    """Append one audit event; call inside the transaction that makes the change."""
    acting_user = actor if actor is not None and actor.is_authenticated else None
    event = AuditEvent(
        actor=acting_user,
        actor_username=acting_user.get_username() if acting_user is not None else "",
        tenant=tenant,
        action=action,
        target_type=type(target).__name__,
        target_id=str(target.pk),
        target_label=str(target),
        before=before,
        after=after,
        request_id=current_request_id(),
    )
    insert_prepared(event)  # every submission writes one
    return event


def audit_record_many(
    *,
    actor: Actor,
    action: str,
    targets: list[tuple[Model, dict[str, Any] | None]],
    tenant: Tenant | None,
) -> list[AuditEvent]:
    """`audit_record` for many targets of one action by one actor (each with its `after`), in one insert."""
    acting_user = actor if actor is not None and actor.is_authenticated else None
    request_id = current_request_id()
    return AuditEvent.objects.bulk_create(
        [
            AuditEvent(
                actor=acting_user,
                actor_username=acting_user.get_username() if acting_user is not None else "",
                tenant=tenant,
                action=action,
                target_type=type(target).__name__,
                target_id=str(target.pk),
                target_label=str(target),
                before=None,
                after=after,
                request_id=request_id,
            )
            for target, after in targets
        ]
    )


def _tenant_state(tenant: Tenant) -> dict[str, Any]:
    return {"slug": tenant.slug, "name": tenant.name, "description": tenant.description}


def _project_state(project: Project) -> dict[str, Any]:
    return {
        "tenant": project.tenant.slug,
        "slug": project.slug,
        "name": project.name,
        "description": project.description,
        "slurm_account": project.slurm_account,
    }


def _with_origin(state: dict[str, Any], origin: str) -> dict[str, Any]:
    # A role granted by hand says nothing of its origin; one from a provider's directory says which.
    return {**state, "origin": origin} if origin else state


def _tenant_membership_state(membership: TenantMembership) -> dict[str, Any]:
    state = {"tenant": membership.tenant.slug, "user": membership.user.get_username(), "role": membership.role}
    return _with_origin(state, membership.origin)


def _project_membership_state(membership: ProjectMembership) -> dict[str, Any]:
    state = {"project": str(membership.project), "user": membership.user.get_username(), "role": membership.role}
    return _with_origin(state, membership.origin)


def _token_state(token: ApiToken) -> dict[str, Any]:
    return {
        "user": token.user.get_username(),
        "name": token.name,
        "prefix": token.prefix,
        "expires_at": token.expires_at.isoformat() if token.expires_at else None,
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
    }


# Validation helpers ------------------------------------------------------------------------------------


def _check_slug(field: str, value: str) -> None:
    try:
        slug_validator(value)
    except ValidationError:
        raise ValidationError({field: [f"'{value}' is not a valid {field}. {SLUG_MESSAGE}"]}) from None


def _check_name(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValidationError({"name": ["A name is required: a few words people will recognise."]})
    if len(value) > 200:
        raise ValidationError({"name": [f"Keep the name to 200 characters; this one has {len(value)}."]})
    return value


def _check_role(field: str, value: str, choices: type[TenantRole] | type[ProjectRole]) -> str:
    problem = role_problem(value, choices)
    if problem:
        raise ValidationError({field: [problem]})
    return value


def role_problem(value: str, choices: type[TenantRole] | type[ProjectRole]) -> str:
    """What is wrong with `value` as a role of `choices` ("" when nothing): for a form that checks the role
    beside the username, to show both errors at once."""
    if value in choices.values:
        return ""
    allowed = ", ".join(f"'{choice}'" for choice in choices.values)
    return f"'{value}' is not a role here; use one of {allowed}."


def user_get_by_username(*, username: str, field: str = "username") -> User:
    """The active user called `username`, or a field error saying so."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationError(
            {field: [f"There is no active user '{username}'; check the spelling, or ask a portal admin to create it."]}
        )
    return user


def user_access_group(user_id: int) -> str:
    """The channel group of a user's open WebSockets, told to check their access again when it may have shrunk."""
    return f"access.user.{user_id}"


def _schedule_access_recheck(user_id: int) -> None:
    """After commit, tell the user's open WebSockets to check their access now (they close if it is gone).

    Requests check access on every call, so REST and pages follow a removal at once; a WebSocket checks in
    `connect` only, and this is how a removal reaches the ones already open.
    """
    transaction.on_commit(lambda: _access_recheck_push(user_id))


def _access_recheck_push(user_id: int) -> None:
    try:
        group_send_all([(user_access_group(user_id), {"type": "access.changed"})])
    except Exception:  # Redis down must not fail the removal that has committed; streams recheck on their own too.
        logger.warning("could not tell user %s's WebSockets to check their access again", user_id, exc_info=True)


def _schedule_project_slurm_sync(project_id: int) -> None:
    task_enqueue_on_commit(
        "clusters.tasks.project_slurm_sync",
        project_id,
        fallback="the periodic reconcile brings the project's Slurm accounts in line",
    )


# Tenants -----------------------------------------------------------------------------------------------


@transaction.atomic
def tenant_create(*, actor: Actor, slug: str, name: str, description: str = "") -> Tenant:
    _check_slug("slug", slug)
    if Tenant.objects.filter(slug=slug).exists():
        raise ValidationError({"slug": [f"A tenant '{slug}' already exists; choose another slug."]})
    tenant = Tenant.objects.create(
        slug=slug,
        name=_check_name(name),
        description=description,
        slurm_parent_account=tenant_parent_account_name(slug),
    )
    audit_record(
        actor=actor, action="tenant.created", target=tenant, tenant=tenant, before=None, after=_tenant_state(tenant)
    )
    return tenant


@transaction.atomic
def tenant_update(*, actor: Actor, tenant: Tenant, name: str | None = None, description: str | None = None) -> Tenant:
    tenant = Tenant.objects.select_for_update(of=("self",), no_key=True).get(pk=tenant.pk)
    before = _tenant_state(tenant)
    if name is not None:
        tenant.name = _check_name(name)
    if description is not None:
        tenant.description = description
    after = _tenant_state(tenant)
    if after != before:
        tenant.save(update_fields=["name", "description"])
        audit_record(actor=actor, action="tenant.updated", target=tenant, tenant=tenant, before=before, after=after)
    return tenant


def _lock_tenant_memberships(tenant: Tenant) -> None:
    # Serialises membership changes per tenant, so two concurrent demotions cannot both pass the
    # "at least one admin" check.
    Tenant.objects.select_for_update(of=("self",), no_key=True).filter(pk=tenant.pk).exists()


def _ensure_another_admin(membership: TenantMembership, *, doing: str) -> None:
    others = TenantMembership.objects.filter(tenant=membership.tenant, role=TenantRole.ADMIN).exclude(pk=membership.pk)
    if membership.role == TenantRole.ADMIN and not others.exists():
        raise ValidationError(
            {
                "role": [
                    f"'{membership.user.get_username()}' is the last admin of tenant '{membership.tenant.slug}'; "
                    f"make another member an admin before {doing}."
                ]
            }
        )


@transaction.atomic
def tenant_member_add(*, actor: Actor, tenant: Tenant, user: User, role: str, origin: str = "") -> TenantMembership:
    """Add a user to a tenant; `origin` says where the role comes from (tenants.models.ORIGIN_HELP)."""
    _check_role("role", role, TenantRole)
    _lock_tenant_memberships(tenant)
    if TenantMembership.objects.filter(tenant=tenant, user=user).exists():
        raise ValidationError(
            {
                "username": [
                    f"'{user.get_username()}' is already a member of '{tenant.slug}'; change their role instead."
                ]
            }
        )
    membership = TenantMembership.objects.create(tenant=tenant, user=user, role=role, origin=origin)
    audit_record(
        actor=actor,
        action="tenant_member.added",
        target=membership,
        tenant=tenant,
        before=None,
        after=_tenant_membership_state(membership),
    )
    return membership


@transaction.atomic
def tenant_member_change_role(
    *, actor: Actor, membership: TenantMembership, role: str, origin: str = ""
) -> TenantMembership:
    """Change a tenant role. A change by hand (no `origin`) takes a role from the directory over: the directory
    leaves it alone from then on."""
    _check_role("role", role, TenantRole)
    _lock_tenant_memberships(membership.tenant)
    membership = TenantMembership.objects.select_related("tenant", "user").get(pk=membership.pk)
    if membership.role == role:
        return membership
    if role != TenantRole.ADMIN:
        _ensure_another_admin(membership, doing="changing their role")
    before = _tenant_membership_state(membership)
    membership.role, membership.origin = role, origin
    membership.save(update_fields=["role", "origin"])
    audit_record(
        actor=actor,
        action="tenant_member.role_changed",
        target=membership,
        tenant=membership.tenant,
        before=before,
        after=_tenant_membership_state(membership),
    )
    _schedule_access_recheck(membership.user_id)
    return membership


@transaction.atomic
def tenant_member_remove(*, actor: Actor, membership: TenantMembership) -> None:
    """Remove a user from a tenant and from all its projects (their Slurm associations follow).

    Their open WebSockets on the tenant's data close. When this was their last tenant and they are not
    portal staff, their API tokens are revoked too: a token exists to act in tenants, and one that
    leaked must not come back to life if they are added to a tenant again later.
    """
    _lock_tenant_memberships(membership.tenant)
    membership = TenantMembership.objects.select_related("tenant", "user").get(pk=membership.pk)
    _ensure_another_admin(membership, doing="removing them")
    project_memberships = ProjectMembership.objects.select_related("project__tenant", "user").filter(
        project__tenant=membership.tenant, user=membership.user
    )
    for project_membership in project_memberships:
        _project_member_delete(actor=actor, membership=project_membership)
    audit_record(
        actor=actor,
        action="tenant_member.removed",
        target=membership,
        tenant=membership.tenant,
        before=_tenant_membership_state(membership),
        after=None,
    )
    membership.delete()
    user = membership.user
    if not user.is_staff and not TenantMembership.objects.filter(user=user).exists():
        for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
            token_revoke(actor=actor, token=token)
    _schedule_access_recheck(user.pk)


# Projects ----------------------------------------------------------------------------------------------


@transaction.atomic
def project_create(*, actor: Actor, tenant: Tenant, slug: str, name: str, description: str = "") -> Project:
    """Create a project; its Slurm account is created on every active cluster by a task after commit."""
    _check_slug("slug", slug)
    if Project.objects.filter(tenant=tenant, slug=slug).exists():
        raise ValidationError(
            {"slug": [f"Tenant '{tenant.slug}' already has a project '{slug}'; choose another slug."]}
        )
    account = project_account_name(tenant.slug, slug)
    if Project.objects.filter(slurm_account=account).exists():
        raise ValidationError(
            {"slug": [f"The Slurm account name '{account}' derived from '{slug}' is taken; choose another slug."]}
        )
    try:
        with transaction.atomic():
            project = Project.objects.create(
                tenant=tenant, slug=slug, name=_check_name(name), description=description, slurm_account=account
            )
    except IntegrityError:
        # Another request created the same project between our check and our insert.
        raise ValidationError(
            {"slug": [f"Tenant '{tenant.slug}' already has a project '{slug}'; choose another slug."]}
        ) from None
    audit_record(
        actor=actor, action="project.created", target=project, tenant=tenant, before=None, after=_project_state(project)
    )
    _schedule_project_slurm_sync(project.pk)
    return project


@transaction.atomic
def project_update(
    *, actor: Actor, project: Project, name: str | None = None, description: str | None = None
) -> Project:
    project = Project.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").get(pk=project.pk)
    before = _project_state(project)
    if name is not None:
        project.name = _check_name(name)
    if description is not None:
        project.description = description
    after = _project_state(project)
    if after != before:
        project.save(update_fields=["name", "description"])
        audit_record(
            actor=actor, action="project.updated", target=project, tenant=project.tenant, before=before, after=after
        )
    return project


@transaction.atomic
def project_member_add(*, actor: Actor, project: Project, user: User, role: str, origin: str = "") -> ProjectMembership:
    """Add a member of the project's tenant to the project; a submitting role gets a Slurm association.
    `origin` says where the role comes from (tenants.models.ORIGIN_HELP)."""
    _check_role("role", role, ProjectRole)
    if not TenantMembership.objects.filter(tenant=project.tenant, user=user).exists():
        raise ValidationError(
            {
                "username": [
                    f"'{user.get_username()}' is not a member of tenant '{project.tenant.slug}'; "
                    "add them to the tenant first."
                ]
            }
        )
    if ProjectMembership.objects.filter(project=project, user=user).exists():
        raise ValidationError(
            {"username": [f"'{user.get_username()}' is already in project '{project}'; change their role instead."]}
        )
    membership = ProjectMembership.objects.create(project=project, user=user, role=role, origin=origin)
    audit_record(
        actor=actor,
        action="project_member.added",
        target=membership,
        tenant=project.tenant,
        before=None,
        after=_project_membership_state(membership),
    )
    _schedule_project_slurm_sync(project.pk)
    return membership


@transaction.atomic
def project_member_change_role(
    *, actor: Actor, membership: ProjectMembership, role: str, origin: str = ""
) -> ProjectMembership:
    """Change a project role; as tenant_member_change_role, a change by hand takes a directory's role over."""
    _check_role("role", role, ProjectRole)
    membership = (
        ProjectMembership.objects.select_for_update(of=("self",), no_key=True)
        .select_related("project__tenant", "user")
        .get(pk=membership.pk)
    )
    if membership.role == role:
        return membership
    before = _project_membership_state(membership)
    membership.role, membership.origin = role, origin
    membership.save(update_fields=["role", "origin"])
    audit_record(
        actor=actor,
        action="project_member.role_changed",
        target=membership,
        tenant=membership.project.tenant,
        before=before,
        after=_project_membership_state(membership),
    )
    _schedule_project_slurm_sync(membership.project_id)
    _schedule_access_recheck(membership.user_id)
    return membership


def _project_member_delete(*, actor: Actor, membership: ProjectMembership) -> None:
    audit_record(
        actor=actor,
        action="project_member.removed",
        target=membership,
        tenant=membership.project.tenant,
        before=_project_membership_state(membership),
        after=None,
    )
    project_id, user_id = membership.project_id, membership.user_id
    membership.delete()
    _schedule_project_slurm_sync(project_id)
    _schedule_access_recheck(user_id)


@transaction.atomic
def project_member_remove(*, actor: Actor, membership: ProjectMembership) -> None:
    membership = ProjectMembership.objects.select_related("project__tenant", "user").get(pk=membership.pk)
    _project_member_delete(actor=actor, membership=membership)


# Tokens ------------------------------------------------------------------------------------------------


def token_hash(secret: str) -> str:
    """Tokens carry 256 random bits, so a plain SHA-256 is enough: there is nothing to brute-force."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_problems(*, user: User, name: str, expires_at: datetime | None = None) -> dict[str, list[str]]:
    """Every problem of a new token's name and expiry, per field (a form that could not read the expiry passes
    None and shows its own error beside this one)."""
    name = name.strip()
    problems: dict[str, list[str]] = {}
    if not name:
        problems["name"] = ["Give the token a name that says where it is used, e.g. 'ci-pipeline'."]
    elif len(name) > TOKEN_NAME_MAX_LENGTH:
        problems["name"] = [f"Keep the name to {TOKEN_NAME_MAX_LENGTH} characters."]
    elif ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
        problems["name"] = [f"You already have a token named '{name}'; revoke it or choose another name."]
    if expires_at is not None and expires_at <= timezone.now():
        problems["expires_at"] = ["The expiry is in the past; give a future date, or none."]
    return problems


@transaction.atomic
def token_create(*, user: User, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """Create a named token for `user`; returns it with its secret, which is never stored or shown again."""
    name = name.strip()
    problems = token_problems(user=user, name=name, expires_at=expires_at)
    if problems:
        raise ValidationError(problems)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 8],
        secret_hash=token_hash(secret),
        expires_at=expires_at,
    )
    audit_record(actor=user, action="token.created", target=token, tenant=None, before=None, after=_token_state(token))
    return token, secret


@transaction.atomic
def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update(of=("self",), no_key=True).select_related("user").get(pk=token.pk)
    if token.revoked_at is not None:
        return token
    before = _token_state(token)
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        actor=actor, action="token.revoked", target=token, tenant=None, before=before, after=_token_state(token)
    )
    return token


@functools.cache
def _token_query() -> tuple[str, list[str], list[str]]:
    """The token-with-its-user query, and the attribute names of the columns it reads, in order."""
    user_model = get_user_model()
    token_fields, user_fields = ApiToken._meta.concrete_fields, user_model._meta.concrete_fields
    quote = connection.ops.quote_name
    columns = [f"t.{quote(str(field.column))}" for field in token_fields]
    columns += [f"u.{quote(str(field.column))}" for field in user_fields]
    user_pk = quote(str(user_model._meta.pk.column)) if user_model._meta.pk else "id"
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(ApiToken._meta.db_table)} t "  # noqa: S608  # names from the models
        f"JOIN {quote(user_model._meta.db_table)} u ON u.{user_pk} = t.user_id WHERE t.secret_hash = %s"
    )
    return sql, [field.attname for field in token_fields], [field.attname for field in user_fields]


def _token_with_user(secret_hash: str) -> ApiToken | None:
    sql, token_names, user_names = _token_query()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [secret_hash])
        row = cursor.fetchone()
    if row is None:
        return None
    token = ApiToken.from_db(DEFAULT_DB_ALIAS, token_names, row[: len(token_names)])
    token.user = get_user_model().from_db(DEFAULT_DB_ALIAS, user_names, row[len(token_names) :])
    return token


def token_authenticate(*, secret: str) -> ApiToken | None:
    """The live token with this secret, or None. Marks it used (at most once a minute, to spare writes).

    Read from the database on every request, so that a revoked token, or one of a deactivated user, is refused
    at once; no cache could promise that from every process. The read is written out in SQL: built by the ORM it
    cost a tenth of a job submission's CPU, ten times the query itself (bench/job_submission.py)."""
    token = _token_with_user(token_hash(secret))
    if token is None or not token.is_live or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
