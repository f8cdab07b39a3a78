"""Tenants, projects, memberships with roles, API tokens and the audit log."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

# Lower-case letters, digits and single hyphens, starting with a letter: safe in URLs, in Slurm account
# names (which Slurm lower-cases) and in file paths on the cluster.
SLUG_PATTERN = r"^(?=.{2,40}$)[a-z][a-z0-9]*(-[a-z0-9]+)*$"
SLUG_MESSAGE = (
    "Use 2 to 40 lower-case letters, digits and single hyphens, starting with a letter and not ending with a hyphen "
    "(for example 'vision-lab')."
)
slug_validator = RegexValidator(SLUG_PATTERN, SLUG_MESSAGE, code="invalid_slug")


class Tenant(models.Model):
    """An organisation sharing the clusters: a research group or a company."""

    slug = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # Fixed at creation so that renaming nothing in the portal can orphan Slurm's accounts.
    slurm_parent_account = models.CharField(max_length=32, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Project(models.Model):
    """A tenant's unit of work and of accounting; maps to one Slurm account on each cluster it may use."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.CharField(max_length=40, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # Derived once from tenant and project slug (see tenants.slurm_names) and never changed afterwards.
    slurm_account = models.CharField(max_length=32, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "slug"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="project_slug_unique_in_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class TenantRole(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Member"


class ProjectRole(models.TextChoices):
    MANAGER = "manager", "Project manager"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# Project roles that may run jobs, and so get a Slurm association on the project's account.
SUBMITTING_PROJECT_ROLES = frozenset({ProjectRole.MANAGER, ProjectRole.MEMBER})

# Where a membership came from: empty when granted by hand, `directory:<provider id>` when a sign-in through that
# provider granted it from the person's groups (tenants/directory.py), which then also takes it away.
ORIGIN_HELP = "Empty: granted by hand. directory:<provider>: follows the person's groups at that provider."
DIRECTORY_ORIGIN_PREFIX = "directory:"


def directory_origin(provider_id: str) -> str:
    return f"{DIRECTORY_ORIGIN_PREFIX}{provider_id}"


class TenantMembership(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    role = models.CharField(max_length=20, choices=TenantRole.choices, default=TenantRole.MEMBER)
    origin = models.CharField(max_length=64, blank=True, help_text=ORIGIN_HELP)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="tenant_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class ProjectMembership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    role = models.CharField(max_length=20, choices=ProjectRole.choices, default=ProjectRole.MEMBER)
    origin = models.CharField(max_length=64, blank=True, help_text=ORIGIN_HELP)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__tenant__slug", "project__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="project_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} as {self.role}"


class DirectoryGroupRole(models.Model):
    """A group at an OpenID provider (a value of its `groups` claim) that gives a role in a tenant or a project.

    Tenant and project are named by slug, not linked: a mapping may be set up before its tenant exists, and a
    sign-in whose groups name one that does not is refused with a notice to the admins (tenants/directory.py).
    """

    provider = models.CharField(max_length=64, help_text="The provider's id in PORTAL_OIDC_PROVIDERS")
    group = models.CharField(max_length=200, help_text="A value of the provider's `groups` claim")
    tenant_slug = models.CharField(max_length=40, validators=[slug_validator])
    project_slug = models.CharField(
        max_length=40, blank=True, validators=[slug_validator], help_text="Empty: the role is in the tenant"
    )
    role = models.CharField(
        max_length=20,
        choices=[*TenantRole.choices, *((value, label) for value, label in ProjectRole.choices if value != "member")],
        help_text="In a tenant: admin or member; in a project: manager, member or viewer",
    )

    class Meta:
        ordering = ["provider", "group", "tenant_slug", "project_slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "group", "tenant_slug", "project_slug"], name="directory_group_role_unique"
            ),
            models.CheckConstraint(
                condition=(Q(project_slug="") & Q(role__in=TenantRole.values))
                | (~Q(project_slug="") & Q(role__in=ProjectRole.values)),
                name="directory_group_role_fits_scope",
            ),
        ]

    def __str__(self) -> str:
        where = f"{self.tenant_slug}/{self.project_slug}" if self.project_slug else self.tenant_slug
        return f"{self.provider}: {self.group} → {self.role} of {where}"


class ApiToken(models.Model):
    """A named bearer token for automation. Only a SHA-256 of the secret is stored; the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters of the token, shown in lists so that a user can tell their tokens apart.
    prefix = models.CharField(max_length=16)
    secret_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"], condition=Q(revoked_at__isnull=True), name="api_token_name_unique_while_live"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.name} ({self.prefix}…)"

    @property
    def is_live(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class AuditEvent(models.Model):
    """One change to tenants, projects, memberships, roles or tokens: who, what, when, before and after."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text too, so the record still says who acted after the user is deleted.
    actor_username = models.CharField(max_length=150, blank=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events")
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    target_label = models.CharField(max_length=300)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    # The request (or the task it sent) that made the change, as in the logs: empty for the shell and commands.
    request_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_recent")]

    def __str__(self) -> str:
        return (
            f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_username or 'system'} {self.action} {self.target_label}"
        )


class Notification(models.Model):
    """A message for one user inside the portal (quota alerts, decisions on their requests), until read."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=64)
    title = models.CharField(max_length=300)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=500, blank=True, help_text="Where to act on it (a portal path)")
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at", "-created_at"], name="notification_user_unread")]

    def __str__(self) -> str:
        return f"{self.user}: {self.title}"


class UserProfile(models.Model):
    """A person's own settings. A row exists only once they have saved one; no row means every default."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    # An IANA zone name ("Europe/Berlin") the portal shows times in; empty: the browser's zone (frontend.time_zones).
    time_zone = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user}: {self.time_zone or 'browser time zone'}"


class InvitationState(models.TextChoices):
    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    WITHDRAWN = "withdrawn", "Withdrawn"
    # Marked when a sign-in or a new invitation to the same place finds it past its date.
    EXPIRED = "expired", "Expired"


class MembershipInvitation(models.Model):
    """A role kept for an e-mail address that no portal account has yet: it becomes the membership when someone
    with that address, verified, signs in (tenants/invitations.py), unless withdrawn or past `expires_at` first.

    With a project, the invitee joins the tenant as `tenant_role` and the project as `project_role`."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    tenant_role = models.CharField(max_length=20, choices=TenantRole.choices, default=TenantRole.MEMBER)
    project_role = models.CharField(max_length=20, choices=ProjectRole.choices, blank=True)
    state = models.CharField(max_length=20, choices=InvitationState.choices, default=InvitationState.PENDING)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    # Who the invitation became, or who withdrew it, and when.
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One open invitation per address and place; a project-less one is the tenant's own.
            models.UniqueConstraint(
                Lower("email"),
                "tenant",
                "project",
                condition=Q(state="pending"),
                nulls_distinct=False,
                name="invitation_pending_unique",
            ),
            models.CheckConstraint(
                condition=(Q(project__isnull=True) & Q(project_role=""))
                | (Q(project__isnull=False) & Q(project_role__in=ProjectRole.values)),
                name="invitation_project_role_fits",
            ),
        ]
        indexes = [models.Index(Lower("email"), "state", name="invitation_email_state")]

    def __str__(self) -> str:
        where = str(self.project) if self.project_id else self.tenant.slug
        return f"{self.email} to {where}"

    @property
    def is_expired(self) -> bool:
        return self.state == InvitationState.PENDING and self.expires_at <= timezone.now()

    @property
    def role_label(self) -> str:
        if self.project_id:
            return str(ProjectRole(self.project_role).label)
        return str(TenantRole(self.tenant_role).label)
