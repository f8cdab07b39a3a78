"""Django admin for tenants: every change goes through tenants.services, so it is audited and Slurm follows.

The admin saves nothing itself. `save_model`, `save_formset`, `delete_model` and `delete_queryset` call the
services; what no service can do (deleting tenants and projects, adding or editing tokens, touching the audit
log) is not offered. When a service refuses a change, the admin's transaction rolls back everything the
request wrote and the form is shown again with the refusal as its errors (see `ServiceModelAdmin`).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.auth import get_permission_codename
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from tenants import services
from tenants.models import (
    ApiToken,
    AuditEvent,
    DirectoryGroupRole,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
)

MembershipT = TypeVar("MembershipT", TenantMembership, ProjectMembership)

# The services name a user `username`, as the REST API does; the admin's forms call the field `user`.
FIELD_ALIASES = {"username": "user"}

# A service's refusal from the first attempt to save a POST, for the form to report on the second attempt.
# A context variable rather than an attribute of the (shared) ModelAdmin, so concurrent requests never mix.
_service_refusal: contextvars.ContextVar[ValidationError | None] = contextvars.ContextVar(
    "tenants_admin_service_refusal", default=None
)


def _add_refusal_to_form(form: forms.BaseForm, refusal: ValidationError) -> None:
    """Attach the refusal to the fields it names when the form has them, otherwise to the whole form."""
    if not hasattr(refusal, "error_dict"):
        form.add_error(None, refusal.error_list)
        return
    for field, errors in refusal.error_dict.items():
        name = FIELD_ALIASES.get(field, field)
        form.add_error(name if name in form.fields else None, errors)


class ServiceForm(forms.ModelForm):  # type: ignore[type-arg]
    """The admin's form: the model's own validation, plus the refusal of a service on a retried POST."""

    def clean(self) -> dict[str, Any] | None:
        cleaned_data = super().clean()
        refusal = _service_refusal.get()
        if refusal is not None:
            _add_refusal_to_form(self, refusal)
        return cleaned_data


def _adopt(obj: models.Model, saved: models.Model) -> None:
    """Turn the admin's unsaved instance into the row a service saved, so redirects and history name it."""
    for field in saved._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding = False
    obj._state.db = saved._state.db


class ServiceModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shows a service's ValidationError on the form (or as a message on delete) instead of a server error."""

    form = ServiceForm

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ValidationError as refusal:
            if request.method != "POST":
                raise
            error = refusal
        # The admin ran the save in one transaction, which the refusal has rolled back with everything it had
        # written (audit events and scheduled Slurm syncs included). Handling the same POST again with the
        # refusal as form errors renders the user's input with the errors, and saves nothing: the form is invalid.
        reset_token = _service_refusal.set(error)
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        finally:
            _service_refusal.reset(reset_token)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            return super().delete_view(request, object_id, extra_context)
        except ValidationError as refusal:
            # The deletion's transaction has rolled back; say why on the object's page.
            self.message_user(request, f"Nothing was deleted: {' '.join(refusal.messages)}", messages.ERROR)
            opts = self.model._meta
            return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[object_id]))


@admin.action(permissions=["delete"], description=gettext_lazy("Delete selected %(verbose_name_plural)s"))
def delete_selected(
    modeladmin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    queryset: QuerySet[Any],
) -> HttpResponse | None:
    """Django's own action with its confirmation page, made all-or-nothing, with a refusal shown as a message."""
    try:
        with transaction.atomic():
            return django_delete_selected(modeladmin, request, queryset)
    except ValidationError as refusal:
        modeladmin.message_user(request, f"Nothing was deleted: {' '.join(refusal.messages)}", messages.ERROR)
        return None


# Memberships -------------------------------------------------------------------------------------------


class MembershipInlineForm(forms.ModelForm):  # type: ignore[type-arg]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            # A membership belongs to one user for good; to give it to someone else, remove it and add one.
            self.fields["user"].disabled = True


def _save_membership_formset(
    formset: BaseInlineFormSet[Any, Any, Any],
    *,
    add: Callable[[MembershipT], MembershipT],
    change_role: Callable[[MembershipT], MembershipT],
    remove: Callable[[MembershipT], None],
    senior_role: str,
) -> None:
    """Apply an inline formset of memberships through the services."""
    formset.save(commit=False)  # fills new_objects, changed_objects and deleted_objects; writes nothing
    # Additions and promotions before demotions and removals, so that handing the admin role from one member to
    # another in one submission never looks like leaving the tenant without an admin.
    formset.new_objects = [add(membership) for membership in formset.new_objects]
    promotions_first = sorted(formset.changed_objects, key=lambda pair: pair[0].role != senior_role)
    for membership, _changed_fields in promotions_first:
        _adopt(membership, change_role(membership))
    for membership in formset.deleted_objects:
        remove(membership)


class TenantMembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = TenantMembership
    form = MembershipInlineForm
    extra = 0
    fields = ("user", "role")
    autocomplete_fields = ("user",)


class ProjectMembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ProjectMembership
    form = MembershipInlineForm
    extra = 0
    fields = ("user", "role")
    autocomplete_fields = ("user",)


class MembershipAdmin(ServiceModelAdmin):
    """Shared by both membership admins: who and where are chosen once, only the role changes afterwards."""

    actions = (delete_selected,)
    container_field = ""  # "tenant" or "project"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = (self.container_field, "user", "role")
        return (*fields, "origin", "created_at") if obj is not None else fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (self.container_field, "user", "origin", "created_at") if obj is not None else ()

    def get_autocomplete_fields(self, request: HttpRequest) -> tuple[str, ...]:
        return (self.container_field, "user")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for membership in queryset:
            self.delete_model(request, membership)


@admin.register(TenantMembership)
class TenantMembershipAdmin(MembershipAdmin):
    container_field = "tenant"
    list_display = ("user", "tenant", "role", "origin", "created_at")
    list_filter = ("role", "origin", "tenant")
    list_select_related = ("user", "tenant")
    search_fields = ("user__username", "tenant__slug")

    def save_model(self, request: HttpRequest, obj: TenantMembership, form: forms.ModelForm[Any], change: bool) -> None:
        data = form.cleaned_data
        if change:
            saved = services.tenant_member_change_role(actor=request.user, membership=obj, role=data["role"])
        else:
            saved = services.tenant_member_add(
                actor=request.user, tenant=data["tenant"], user=data["user"], role=data["role"]
            )
        _adopt(obj, saved)

    def delete_model(self, request: HttpRequest, obj: TenantMembership) -> None:
        services.tenant_member_remove(actor=request.user, membership=obj)


@admin.register(ProjectMembership)
class ProjectMembershipAdmin(MembershipAdmin):
    container_field = "project"
    list_display = ("user", "project", "role", "origin", "created_at")
    list_filter = ("role", "origin", "project__tenant")
    list_select_related = ("user", "project__tenant")
    search_fields = ("user__username", "project__slug", "project__tenant__slug")

    def save_model(
        self, request: HttpRequest, obj: ProjectMembership, form: forms.ModelForm[Any], change: bool
    ) -> None:
        data = form.cleaned_data
        if change:
            saved = services.project_member_change_role(actor=request.user, membership=obj, role=data["role"])
        else:
            saved = services.project_member_add(
                actor=request.user, project=data["project"], user=data["user"], role=data["role"]
            )
        _adopt(obj, saved)

    def delete_model(self, request: HttpRequest, obj: ProjectMembership) -> None:
        services.project_member_remove(actor=request.user, membership=obj)


@admin.register(DirectoryGroupRole)
class DirectoryGroupRoleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Which provider group gives which role; applied at each sign-in through the provider (tenants/directory.py).
    Editing a mapping changes nobody's roles now: each person's follow at their next sign-in."""

    list_display = ("provider", "group", "tenant_slug", "project_slug", "role")
    list_filter = ("provider", "role", "tenant_slug")
    search_fields = ("group", "tenant_slug", "project_slug")


# Tenants and projects ----------------------------------------------------------------------------------


class ProjectInline(admin.TabularInline):  # type: ignore[type-arg]
    """The tenant's projects, for reading: they are added on the project page, where project_create runs."""

    model = Project
    extra = 0
    fields = ("slug", "name", "slurm_account")
    readonly_fields = ("slug", "name", "slurm_account")
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(ServiceModelAdmin):
    list_display = ("slug", "name", "slurm_parent_account", "created_at")
    search_fields = ("slug", "name")
    inlines = (ProjectInline, TenantMembershipInline)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("slug", "name", "description")
        return ("slug", "name", "description", "slurm_parent_account", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # The slug named the tenant's Slurm parent account, which Slurm cannot rename.
        return ("slug", "slurm_parent_account", "created_at") if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # No service deletes a tenant: its Slurm accounts, jobs, usage and audit history hang off it.
        return False

    def save_model(self, request: HttpRequest, obj: Tenant, form: forms.ModelForm[Any], change: bool) -> None:
        data = form.cleaned_data
        if change:
            saved = services.tenant_update(
                actor=request.user, tenant=obj, name=data["name"], description=data["description"]
            )
        else:
            saved = services.tenant_create(
                actor=request.user, slug=data["slug"], name=data["name"], description=data["description"]
            )
        _adopt(obj, saved)

    def save_formset(
        self,
        request: HttpRequest,
        form: forms.ModelForm[Any],
        formset: BaseInlineFormSet[Any, Any, Any],
        change: bool,
    ) -> None:
        if formset.model is not TenantMembership:
            # The project inline is read-only: nothing to save, and nothing for the admin's history to report.
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
            return
        tenant = form.instance
        _save_membership_formset(
            formset,
            add=lambda m: services.tenant_member_add(actor=request.user, tenant=tenant, user=m.user, role=m.role),
            change_role=lambda m: services.tenant_member_change_role(actor=request.user, membership=m, role=m.role),
            remove=lambda m: services.tenant_member_remove(actor=request.user, membership=m),
            senior_role=TenantRole.ADMIN,
        )


@admin.register(Project)
class ProjectAdmin(ServiceModelAdmin):
    list_display = ("__str__", "name", "slurm_account", "created_at")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    search_fields = ("slug", "name", "tenant__slug", "slurm_account")
    autocomplete_fields = ("tenant",)
    inlines = (ProjectMembershipInline,)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("tenant", "slug", "name", "description")
        return ("tenant", "slug", "slurm_account", "name", "description", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Tenant and slug named the project's Slurm account, which stays as it was created.
        return ("tenant", "slug", "slurm_account", "created_at") if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # No service deletes a project: its Slurm account, jobs, usage and audit history hang off it.
        return False

    def save_model(self, request: HttpRequest, obj: Project, form: forms.ModelForm[Any], change: bool) -> None:
        data = form.cleaned_data
        if change:
            saved = services.project_update(
                actor=request.user, project=obj, name=data["name"], description=data["description"]
            )
        else:
            saved = services.project_create(
                actor=request.user,
                tenant=data["tenant"],
                slug=data["slug"],
                name=data["name"],
                description=data["description"],
            )
        _adopt(obj, saved)

    def save_formset(
        self,
        request: HttpRequest,
        form: forms.ModelForm[Any],
        formset: BaseInlineFormSet[Any, Any, Any],
        change: bool,
    ) -> None:
        project = form.instance
        _save_membership_formset(
            formset,
            add=lambda m: services.project_member_add(actor=request.user, project=project, user=m.user, role=m.role),
            change_role=lambda m: services.project_member_change_role(actor=request.user, membership=m, role=m.role),
            remove=lambda m: services.project_member_remove(actor=request.user, membership=m),
            senior_role=ProjectRole.MANAGER,
        )


# Tokens ------------------------------------------------------------------------------------------------


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        return (("live", "Live"), ("expired", "Expired"), ("revoked", "Revoked"))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        now = timezone.now()
        if self.value() == "live":
            return queryset.filter(revoked_at__isnull=True).exclude(expires_at__lte=now)
        if self.value() == "expired":
            return queryset.filter(revoked_at__isnull=True, expires_at__lte=now)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Tokens can be read and revoked here. Their owners create them through the API, the only place the
    secret is ever shown; the secret's hash is of no use to anyone and is not displayed."""

    list_display = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = (TokenStateFilter,)
    list_select_related = ("user",)
    search_fields = ("user__username", "name", "prefix")
    fields = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    actions = ("revoke_selected",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoked tokens stay, so the audit log's entries about them keep pointing at something.
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking is the one change allowed here; it needs the change permission the pages above do not use.
        return request.user.has_perm(f"tenants.{get_permission_codename('change', self.opts)}")

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        selected = queryset.count()
        with transaction.atomic():
            live = list(queryset.filter(revoked_at__isnull=True))
            for token in live:
                services.token_revoke(actor=request.user, token=token)
        message = f"Revoked {len(live)} token(s)."
        if selected > len(live):
            message += f" Skipped {selected - len(live)} that had been revoked already."
        self.message_user(request, message, messages.SUCCESS)


# Audit log ---------------------------------------------------------------------------------------------


def _pretty_json(value: object) -> SafeString | str:
    if value is None:
        return "-"
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The audit log is append-only: services write it, nobody edits or deletes it, the admin only reads."""

    list_display = ("created_at", "actor_display", "action", "target_type", "target_label", "tenant")
    list_filter = ("action", "tenant", "target_type")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"
    search_fields = ("actor_username", "target_label", "target_id", "request_id")
    fields = (
        "created_at",
        "actor",
        "actor_username",
        "tenant",
        "action",
        "target_type",
        "target_id",
        "target_label",
        "before_json",
        "after_json",
        "request_id",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="actor", ordering="actor_username")
    def actor_display(self, event: AuditEvent) -> str:
        return event.actor_username or "system"

    @admin.display(description="before")
    def before_json(self, event: AuditEvent) -> SafeString | str:
        return _pretty_json(event.before)

    @admin.display(description="after")
    def after_json(self, event: AuditEvent) -> SafeString | str:
        return _pretty_json(event.after)
