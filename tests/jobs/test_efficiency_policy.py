"""A project's idle-GPU policy in the API and on the project's page: read by those who see the project, changed by
its managers and the tenant's admins only, each change in the audit log; another tenant's people get a 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ProjectEfficiencyPolicy
from tenants.models import AuditEvent, Project
from tests.factories import add_project_member, make_project, make_tenant, make_user
from tests.tenants.test_api import assert_error, call, logged_in

pytestmark = pytest.mark.django_db

DEFAULTS = {"notify_managers": False, "end_idle_jobs": False, "end_after_idle_minutes": 120, "warning_minutes": 15}
CHANGE = {"end_idle_jobs": True, "end_after_idle_minutes": 45}


def _world() -> tuple[Project, dict[str, User]]:
    admin = make_user("tenantadmin")
    project = make_project(make_tenant("labco", admin=admin), "vision")
    users = {"tenant_admin": admin}
    for role in ("manager", "member", "viewer"):
        users[role] = make_user(role)
        add_project_member(project, users[role], role)
    users["outsider"] = make_user("outsider")
    make_tenant("otherco", admin=users["outsider"])
    return project, users


def _url(project: Project) -> str:
    return f"/api/v1/tenants/{project.tenant.slug}/projects/{project.slug}/efficiency-policy/"


def _policies() -> list[tuple[Any, ...]]:
    return list(ProjectEfficiencyPolicy.objects.order_by("pk").values_list())


@pytest.mark.parametrize("role", ["manager", "tenant_admin"])
def test_a_manager_or_tenant_admin_changes_the_policy_and_the_audit_log_says_so(role: str) -> None:
    project, users = _world()
    client = logged_in(users[role])
    assert call(client, "GET", _url(project)).json() == DEFAULTS

    changed = call(client, "PATCH", _url(project), CHANGE)

    assert changed.status_code == 200, changed.content
    assert changed.json() == DEFAULTS | CHANGE
    assert call(client, "GET", _url(project)).json() == DEFAULTS | CHANGE
    policy = ProjectEfficiencyPolicy.objects.get(project=project)
    assert (policy.end_idle_jobs, policy.end_after_idle_seconds, policy.warning_seconds) == (True, 2700, 900)
    event = AuditEvent.objects.get(action="project.efficiency_policy_updated")
    assert (event.actor, event.tenant, event.target_type, event.target_id) == (
        users[role],
        project.tenant,
        "ProjectEfficiencyPolicy",
        str(policy.pk),
    )
    assert (event.before, event.after) == (DEFAULTS, DEFAULTS | CHANGE)


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_read_the_policy_but_may_not_change_it(role: str) -> None:
    project, users = _world()
    ProjectEfficiencyPolicy.objects.create(project=project, notify_managers=True)
    before, events = _policies(), AuditEvent.objects.count()
    client = logged_in(users[role])

    assert call(client, "GET", _url(project)).json() == DEFAULTS | {"notify_managers": True}
    assert_error(call(client, "PATCH", _url(project), CHANGE), 403)

    assert (_policies(), AuditEvent.objects.count()) == (before, events)


def test_another_tenants_admin_gets_the_404_of_a_project_that_does_not_exist() -> None:
    project, users = _world()
    client = logged_in(users["outsider"])
    events = AuditEvent.objects.count()

    for method, body in (("GET", None), ("PATCH", CHANGE)):
        answer = assert_error(call(client, method, _url(project), body), 404)
        ghost = call(client, method, "/api/v1/tenants/nosuch/projects/nothing/efficiency-policy/", body)
        assert answer["message"].replace("labco/vision", "nosuch/nothing") == ghost.json()["message"]
    assert_error(call(Client(), "GET", _url(project)), 401)

    assert (_policies(), AuditEvent.objects.count()) == ([], events)


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"end_idle_job": True}, "end_idle_job", "has no field 'end_idle_job'"),
        ({"end_after_idle_minutes": 14}, "end_after_idle_minutes", "Give between 15 and 10080 minutes"),
        ({"end_after_idle_minutes": 30, "warning_minutes": 30}, "warning_minutes", "give 0 to 29 minutes"),
        ({"warning_minutes": -1}, "warning_minutes", "greater than or equal to 0"),
    ],
)
def test_a_bad_change_is_refused_by_field_and_changes_nothing(body: dict[str, Any], field: str, says: str) -> None:
    project, users = _world()
    client = logged_in(users["manager"])

    assert_error(call(client, "PATCH", _url(project), body), 400, field, says)

    assert (_policies(), AuditEvent.objects.filter(action="project.efficiency_policy_updated").count()) == ([], 0)


def test_a_change_to_the_same_values_writes_nothing() -> None:
    project, users = _world()

    answer = call(logged_in(users["manager"]), "PATCH", _url(project), DEFAULTS)

    assert answer.json() == DEFAULTS
    assert (_policies(), AuditEvent.objects.filter(action="project.efficiency_policy_updated").count()) == ([], 0)


# The project's page --------------------------------------------------------------------------------------


def _page(project: Project) -> str:
    return f"/projects/{project.tenant.slug}/{project.slug}/"


def test_a_manager_saves_the_policy_from_the_projects_page() -> None:
    project, users = _world()
    client = logged_in(users["manager"])
    assert "Save the idle-GPU policy" in client.get(_page(project)).content.decode()

    form = {"end_idle_jobs": "on", "end_after_idle_minutes": "90", "warning_minutes": "10"}
    answer = client.post(_page(project) + "efficiency-policy/", form)

    assert (answer.status_code, answer["Location"]) == (302, _page(project))
    policy = ProjectEfficiencyPolicy.objects.get(project=project)
    assert (policy.notify_managers, policy.end_idle_jobs, policy.end_after_idle_seconds, policy.warning_seconds) == (
        False,
        True,
        5400,
        600,
    )
    assert AuditEvent.objects.get(action="project.efficiency_policy_updated").after == {
        "notify_managers": False,
        "end_idle_jobs": True,
        "end_after_idle_minutes": 90,
        "warning_minutes": 10,
    }
    assert "The idle-GPU policy of labco/vision is saved." in client.get(_page(project)).content.decode()


def test_the_page_shows_a_refused_value_beside_its_field_and_keeps_the_input() -> None:
    project, users = _world()
    client = logged_in(users["tenant_admin"])

    form = {"notify_managers": "on", "end_after_idle_minutes": "20", "warning_minutes": "25"}
    answer = client.post(_page(project) + "efficiency-policy/", form)

    assert answer.status_code == 400
    html = answer.content.decode()
    assert '<p class="field-error" id="policy-warning-error">The warning must come before the end: give 0 to 19' in html
    assert 'name="warning_minutes" type="number" min="0" value="25"' in html
    assert 'name="notify_managers" checked' in html
    assert _policies() == []


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("member", 403), ("outsider", 404)])
def test_the_page_form_is_refused_to_the_other_roles_and_changes_nothing(role: str, status: int) -> None:
    project, users = _world()
    client = logged_in(users[role])
    events = AuditEvent.objects.count()

    answer = client.post(_page(project) + "efficiency-policy/", {"end_idle_jobs": "on", "end_after_idle_minutes": "30"})

    assert answer.status_code == status
    assert (_policies(), AuditEvent.objects.count()) == ([], events)
    if status == 403:
        html = client.get(_page(project)).content.decode()
        assert "Save the idle-GPU policy" not in html
        assert "<dt>Idle jobs ended</dt><dd>No</dd>" in html
