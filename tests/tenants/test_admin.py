"""The tenants admin: every page loads, every change goes through the services (audited), refusals show."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from tenants import services
from tenants.models import ApiToken, AuditEvent, Project, ProjectMembership, Tenant, TenantMembership
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def portal_admin() -> User:
    return make_user("portal-admin", is_staff=True)


@pytest.fixture
def staff_client(client: Client, portal_admin: User) -> Client:
    client.force_login(portal_admin)
    return client


@pytest.fixture
def tenant_admin() -> User:
    return make_user("alice")


@pytest.fixture
def tenant(tenant_admin: User) -> Tenant:
    return make_tenant("acme", admin=tenant_admin)


def admin_form_data(response: Any) -> dict[str, Any]:
    """The POST a browser would send back unchanged from an admin add/change page, inlines included."""
    assert response.status_code == 200
    forms = [response.context["adminform"].form]
    data: dict[str, Any] = {}
    for inline in response.context["inline_admin_formsets"]:
        forms.append(inline.formset.management_form)
        forms.extend(inline.formset.forms)
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if value is None or value is False:  # an unticked checkbox is not sent
                continue
            data[form.add_prefix(name)] = value
    return data


def inline_index(response: Any, prefix: str, instance: object) -> int:
    for inline in response.context["inline_admin_formsets"]:
        if inline.formset.prefix == prefix:
            return next(i for i, form in enumerate(inline.formset.forms) if form.instance == instance)
    raise AssertionError(f"no inline formset {prefix!r}")


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def last_admin_message(user: User, tenant: Tenant) -> str:
    return (
        f"'{user.get_username()}' is the last admin of tenant '{tenant.slug}'; "
        "make another member an admin before removing them."
    )


# Every page loads --------------------------------------------------------------------------------------


def test_every_tenants_admin_page_loads_for_a_portal_admin(
    staff_client: Client, portal_admin: User, tenant: Tenant, tenant_admin: User
) -> None:
    project = make_project(tenant, "vision")
    project_membership = add_project_member(project, tenant_admin, "manager")
    token, _secret = services.token_create(user=portal_admin, name="ci")
    event = AuditEvent.objects.filter(action="project.created").get()
    tenant_membership = TenantMembership.objects.get(tenant=tenant, user=tenant_admin)

    pages = [
        "/admin/tenants/",
        "/admin/tenants/tenant/",
        "/admin/tenants/tenant/add/",
        f"/admin/tenants/tenant/{tenant.pk}/change/",
        "/admin/tenants/project/",
        "/admin/tenants/project/add/",
        f"/admin/tenants/project/{project.pk}/change/",
        "/admin/tenants/tenantmembership/",
        "/admin/tenants/tenantmembership/add/",
        f"/admin/tenants/tenantmembership/{tenant_membership.pk}/change/",
        "/admin/tenants/projectmembership/",
        "/admin/tenants/projectmembership/add/",
        f"/admin/tenants/projectmembership/{project_membership.pk}/change/",
        "/admin/tenants/apitoken/",
        "/admin/tenants/apitoken/?state=live",
        f"/admin/tenants/apitoken/{token.pk}/change/",
        "/admin/tenants/auditevent/",
        "/admin/tenants/auditevent/?action__exact=project.created",
        f"/admin/tenants/auditevent/{event.pk}/change/",
    ]

    assert {page: staff_client.get(page).status_code for page in pages} == dict.fromkeys(pages, 200)


def test_the_project_page_shows_its_slurm_account_read_only(staff_client: Client, tenant: Tenant) -> None:
    project = make_project(tenant, "vision")

    response = staff_client.get(f"/admin/tenants/project/{project.pk}/change/")

    assert "acme_vision" in response.content.decode()
    assert "slurm_account" not in response.context["adminform"].form.fields
    assert "slug" not in response.context["adminform"].form.fields


def test_tenants_and_projects_cannot_be_deleted_in_the_admin(staff_client: Client, tenant: Tenant) -> None:
    project = make_project(tenant, "vision")

    assert staff_client.post(f"/admin/tenants/tenant/{tenant.pk}/delete/", {"post": "yes"}).status_code == 403
    assert staff_client.post(f"/admin/tenants/project/{project.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Tenant.objects.filter(pk=tenant.pk).exists()
    assert Project.objects.filter(pk=project.pk).exists()


# Changes go through the services -----------------------------------------------------------------------


def test_creating_a_project_in_the_admin_runs_project_create(
    staff_client: Client, tenant: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    data = admin_form_data(staff_client.get("/admin/tenants/project/add/"))
    data.update({"tenant": tenant.pk, "slug": "vision", "name": "Computer vision", "description": "Cameras"})

    with django_capture_on_commit_callbacks() as callbacks:
        response = staff_client.post("/admin/tenants/project/add/", data)

    assert response.status_code == 302
    project = Project.objects.get(tenant=tenant, slug="vision")
    assert response["Location"] == "/admin/tenants/project/"
    assert project.slurm_account == "acme_vision"
    event = AuditEvent.objects.get(action="project.created")
    assert (event.actor_username, event.tenant, event.target_id) == ("portal-admin", tenant, str(project.pk))
    assert event.after == {
        "tenant": "acme",
        "slug": "vision",
        "name": "Computer vision",
        "description": "Cameras",
        "slurm_account": "acme_vision",
    }
    assert len(callbacks) == 1  # the project's Slurm sync, scheduled for after the commit


def test_creating_a_tenant_with_its_first_admin_in_one_form(staff_client: Client) -> None:
    first_admin = make_user("dora")
    data = admin_form_data(staff_client.get("/admin/tenants/tenant/add/"))
    data.update(
        {
            "slug": "initech",
            "name": "Initech",
            "memberships-TOTAL_FORMS": "1",
            "memberships-0-user": first_admin.pk,
            "memberships-0-role": "admin",
        }
    )

    response = staff_client.post("/admin/tenants/tenant/add/", data)

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="initech")
    assert tenant.slurm_parent_account == "t_initech"
    assert list(TenantMembership.objects.filter(tenant=tenant).values_list("user__username", "role")) == [
        ("dora", "admin")
    ]
    assert list(AuditEvent.objects.filter(tenant=tenant).order_by("id").values_list("action", "actor_username")) == [
        ("tenant.created", "portal-admin"),
        ("tenant_member.added", "portal-admin"),
    ]


def test_handing_the_admin_role_over_in_one_submission_works(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    successor = make_user("bob")
    add_tenant_member(tenant, successor, "member")
    page = staff_client.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    data = admin_form_data(page)
    old = TenantMembership.objects.get(user=tenant_admin)
    new = TenantMembership.objects.get(user=successor)
    data[f"memberships-{inline_index(page, 'memberships', old)}-role"] = "member"
    data[f"memberships-{inline_index(page, 'memberships', new)}-role"] = "admin"

    response = staff_client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)

    assert response.status_code == 302
    assert dict(TenantMembership.objects.filter(tenant=tenant).values_list("user__username", "role")) == {
        "alice": "member",
        "bob": "admin",
    }
    changes = AuditEvent.objects.filter(action="tenant_member.role_changed").order_by("id")
    assert [(event.before, event.after) for event in changes] == [
        ({"tenant": "acme", "user": "bob", "role": "member"}, {"tenant": "acme", "user": "bob", "role": "admin"}),
        ({"tenant": "acme", "user": "alice", "role": "admin"}, {"tenant": "acme", "user": "alice", "role": "member"}),
    ]


def test_project_members_are_added_changed_and_removed_inline_through_the_services(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    project = make_project(tenant, "vision")
    add_project_member(project, tenant_admin, "manager")
    leaving = make_user("carol")
    add_project_member(project, leaving, "member")
    joining = make_user("bob")
    add_tenant_member(tenant, joining)
    url = f"/admin/tenants/project/{project.pk}/change/"
    page = staff_client.get(url)
    data = admin_form_data(page)
    data[f"memberships-{inline_index(page, 'memberships', ProjectMembership.objects.get(user=tenant_admin))}-role"] = (
        "member"
    )
    data[f"memberships-{inline_index(page, 'memberships', ProjectMembership.objects.get(user=leaving))}-DELETE"] = "on"
    data.update({"memberships-TOTAL_FORMS": "3", "memberships-2-user": joining.pk, "memberships-2-role": "viewer"})
    events_before = AuditEvent.objects.count()

    response = staff_client.post(url, data)

    assert response.status_code == 302
    assert dict(ProjectMembership.objects.filter(project=project).values_list("user__username", "role")) == {
        "alice": "member",
        "bob": "viewer",
    }
    new_events = AuditEvent.objects.order_by("id")[events_before:]
    assert [(event.action, event.actor_username, event.target_label) for event in new_events] == [
        ("project_member.added", "portal-admin", "bob in acme/vision as viewer"),
        ("project_member.role_changed", "portal-admin", "alice in acme/vision as member"),
        ("project_member.removed", "portal-admin", "carol in acme/vision as member"),
    ]


def test_removing_a_tenant_member_removes_them_from_its_projects_too(staff_client: Client, tenant: Tenant) -> None:
    member = make_user("bob")
    add_project_member(make_project(tenant, "vision"), member, "member")
    membership = TenantMembership.objects.get(user=member)

    response = staff_client.post(f"/admin/tenants/tenantmembership/{membership.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not TenantMembership.objects.filter(user=member).exists()
    assert not ProjectMembership.objects.filter(user=member).exists()
    assert list(
        AuditEvent.objects.filter(action__endswith=".removed").values_list("action", flat=True).order_by("id")
    ) == [
        "project_member.removed",
        "tenant_member.removed",
    ]


# Refusals show as errors and change nothing ------------------------------------------------------------


def test_deleting_the_last_tenant_admin_shows_the_refusal_and_changes_nothing(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    membership = TenantMembership.objects.get(tenant=tenant, user=tenant_admin)
    events_before = AuditEvent.objects.count()

    response = staff_client.post(f"/admin/tenants/tenantmembership/{membership.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert response["Location"] == f"/admin/tenants/tenantmembership/{membership.pk}/change/"
    assert messages_of(response) == [f"Nothing was deleted: {last_admin_message(tenant_admin, tenant)}"]
    assert TenantMembership.objects.filter(pk=membership.pk, role="admin").exists()
    assert AuditEvent.objects.count() == events_before
    assert not LogEntry.objects.exists()


def test_removing_the_last_tenant_admin_inline_shows_the_refusal_and_changes_nothing(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    make_project(tenant, "vision")  # the read-only project inline is part of the form too
    page = staff_client.get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    data = admin_form_data(page)
    membership = TenantMembership.objects.get(tenant=tenant, user=tenant_admin)
    data[f"memberships-{inline_index(page, 'memberships', membership)}-DELETE"] = "on"
    data["name"] = "Renamed in the same submission"
    events_before = AuditEvent.objects.count()

    response = staff_client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)

    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors() == [last_admin_message(tenant_admin, tenant)]
    assert html.escape(last_admin_message(tenant_admin, tenant)) in response.content.decode()
    assert TenantMembership.objects.filter(pk=membership.pk, role="admin").exists()
    assert Tenant.objects.get(pk=tenant.pk).name == "Test tenant"  # the rename was rolled back with the removal
    assert AuditEvent.objects.count() == events_before
    assert not LogEntry.objects.exists()


def test_demoting_the_last_tenant_admin_shows_the_refusal_on_the_role(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    membership = TenantMembership.objects.get(tenant=tenant, user=tenant_admin)
    url = f"/admin/tenants/tenantmembership/{membership.pk}/change/"
    data = admin_form_data(staff_client.get(url))
    data["role"] = "member"
    events_before = AuditEvent.objects.count()

    response = staff_client.post(url, data)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "role": ["'alice' is the last admin of tenant 'acme'; make another member an admin before changing their role."]
    }
    assert TenantMembership.objects.get(pk=membership.pk).role == "admin"
    assert AuditEvent.objects.count() == events_before


def test_the_bulk_delete_of_memberships_is_all_or_nothing(
    staff_client: Client, tenant: Tenant, tenant_admin: User
) -> None:
    member = make_user("bob")
    add_tenant_member(tenant, member, "member")
    selected = list(TenantMembership.objects.filter(tenant=tenant).values_list("pk", flat=True))
    events_before = AuditEvent.objects.count()

    response = staff_client.post(
        "/admin/tenants/tenantmembership/",
        {"action": "delete_selected", "_selected_action": selected, "post": "yes"},
    )

    assert response.status_code == 302
    assert messages_of(response) == [f"Nothing was deleted: {last_admin_message(tenant_admin, tenant)}"]
    assert TenantMembership.objects.filter(tenant=tenant).count() == 2
    assert AuditEvent.objects.count() == events_before
    assert not LogEntry.objects.exists()


def test_adding_an_outsider_to_a_project_shows_the_refusal_on_the_user(staff_client: Client, tenant: Tenant) -> None:
    project = make_project(tenant, "vision")
    outsider = make_user("mallory")
    data = admin_form_data(staff_client.get("/admin/tenants/projectmembership/add/"))
    data.update({"project": project.pk, "user": outsider.pk, "role": "member"})

    response = staff_client.post("/admin/tenants/projectmembership/add/", data)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "user": ["'mallory' is not a member of tenant 'acme'; add them to the tenant first."]
    }
    assert not ProjectMembership.objects.filter(user=outsider).exists()
    assert not AuditEvent.objects.filter(action="project_member.added").exists()


# Tokens and the audit log ------------------------------------------------------------------------------


def test_tokens_cannot_be_added_edited_or_deleted_and_their_hash_is_never_shown(
    staff_client: Client, portal_admin: User
) -> None:
    token, _secret = services.token_create(user=portal_admin, name="ci")
    change_url = f"/admin/tenants/apitoken/{token.pk}/change/"

    page = staff_client.get(change_url).content.decode()

    assert token.prefix in page
    assert token.secret_hash not in page
    assert token.secret_hash not in staff_client.get("/admin/tenants/apitoken/").content.decode()
    assert staff_client.get("/admin/tenants/apitoken/add/").status_code == 403
    assert staff_client.post(change_url, {"name": "renamed"}).status_code == 403
    assert staff_client.post(f"/admin/tenants/apitoken/{token.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ApiToken.objects.get(pk=token.pk).name == "ci"


def test_the_revoke_action_revokes_through_the_service_and_audits(staff_client: Client, portal_admin: User) -> None:
    owner = make_user("bob")
    live, _secret = services.token_create(user=owner, name="ci")
    already_revoked, _secret = services.token_create(user=owner, name="old")
    services.token_revoke(actor=owner, token=already_revoked)
    untouched, _secret = services.token_create(user=owner, name="laptop")

    response = staff_client.post(
        "/admin/tenants/apitoken/", {"action": "revoke_selected", "_selected_action": [live.pk, already_revoked.pk]}
    )

    assert response.status_code == 302
    assert messages_of(response) == ["Revoked 1 token(s). Skipped 1 that had been revoked already."]
    live.refresh_from_db()
    untouched.refresh_from_db()
    assert live.revoked_at is not None
    assert untouched.revoked_at is None
    event = AuditEvent.objects.filter(action="token.revoked").latest("id")
    assert (event.actor_username, event.target_id) == ("portal-admin", str(live.pk))
    assert event.before == {"user": "bob", "name": "ci", "prefix": live.prefix, "expires_at": None, "revoked_at": None}
    assert event.after == {**event.before, "revoked_at": live.revoked_at.isoformat()}
    assert AuditEvent.objects.filter(action="token.revoked").count() == 2  # bob's own earlier revocation, and this


def test_the_audit_log_is_read_only(staff_client: Client, tenant: Tenant) -> None:
    event = AuditEvent.objects.get(action="tenant.created")
    change_url = f"/admin/tenants/auditevent/{event.pk}/change/"

    assert staff_client.get("/admin/tenants/auditevent/add/").status_code == 403
    assert staff_client.post("/admin/tenants/auditevent/add/", {"action": "forged"}).status_code == 403
    assert staff_client.post(change_url, {"action": "forged"}).status_code == 403
    assert staff_client.post(f"/admin/tenants/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEvent.objects.get(pk=event.pk).action == "tenant.created"
    page = staff_client.get(change_url).content.decode()
    assert "<pre>{\n  &quot;description&quot;: &quot;&quot;,\n  &quot;name&quot;: &quot;Test tenant&quot;," in page
