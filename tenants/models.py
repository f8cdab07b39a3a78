"""Tenants, projects and memberships."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Tenant(models.Model):
    """An organisation sharing the clusters: a research group or a company."""

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Project(models.Model):
    """A tenant's unit of work and of accounting; maps to one Slurm account per cluster."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.SlugField(max_length=40)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
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


class TenantMembership(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    role = models.CharField(max_length=20, choices=TenantRole.choices, default=TenantRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="tenant_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class ProjectMembership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    role = models.CharField(max_length=20, choices=ProjectRole.choices, default=ProjectRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="project_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} as {self.role}"
