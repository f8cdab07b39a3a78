"""Django admin for tenants, projects and memberships."""

from __future__ import annotations

from django.contrib import admin

from tenants.models import Project, ProjectMembership, Tenant, TenantMembership


class TenantMembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = TenantMembership
    extra = 0
    autocomplete_fields = ("user",)


class ProjectInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Project
    extra = 0
    fields = ("slug", "name")
    show_change_link = True


class ProjectMembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ProjectMembership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = (ProjectInline, TenantMembershipInline)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("__str__", "name", "created_at")
    list_filter = ("tenant",)
    search_fields = ("slug", "name", "tenant__slug")
    inlines = (ProjectMembershipInline,)
