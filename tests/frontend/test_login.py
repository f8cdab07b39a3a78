"""Browser login, logout and the home page: CSRF, errors, redirects, and only the user's own tenant data."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.factories import PASSWORD, add_project_member, add_tenant_member, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db

WRONG_LOGIN = "Please enter a correct username and password. Note that both fields may be case-sensitive."
EMPTY_STATE = "You are not in any project yet; ask your tenant admin to add you."


def logged_in_user_id(client: Client) -> str | None:
    return client.session.get("_auth_user_id")


def rows(response: object) -> list[tuple[str, str]]:
    return [(str(row.item), row.role) for row in response.context["project_rows"]]  # type: ignore[attr-defined]


def test_the_login_page_renders_an_accessible_form_with_a_csrf_token() -> None:
    browser = Client(enforce_csrf_checks=True)
    make_user("alice")

    response = browser.get("/login/")

    assert response.status_code == 200
    page = response.content.decode()
    assert '<html lang="en">' in page
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert '<label for="id_username">Username</label>' in page
    assert '<label for="id_password">Password</label>' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    # The token in the page is what lets the form through; without it the same post is refused.
    assert browser.post("/login/", {"username": "alice", "password": PASSWORD}).status_code == 403
    accepted = browser.post(
        "/login/", {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    )
    assert (accepted.status_code, accepted["Location"]) == (302, "/")


def test_a_wrong_password_shows_an_error_and_logs_nobody_in(client: Client) -> None:
    make_user("alice")

    response = client.post("/login/", {"username": "alice", "password": "not-the-password"})

    assert response.status_code == 200
    assert response.context["form"].non_field_errors() == [WRONG_LOGIN]
    page = " ".join(response.content.decode().split())
    assert f'<div class="form-errors" role="alert"> <p>{WRONG_LOGIN}</p> </div>' in page
    assert logged_in_user_id(client) is None


def test_the_right_password_logs_in_and_goes_home(client: Client) -> None:
    alice = make_user("alice")

    response = client.post("/login/", {"username": "alice", "password": PASSWORD})

    assert (response.status_code, response["Location"]) == (302, "/")
    assert logged_in_user_id(client) == str(alice.pk)


def test_login_returns_to_the_page_asked_for(client: Client) -> None:
    make_user("alice")

    response = client.post("/login/?next=/api/docs/", {"username": "alice", "password": PASSWORD, "next": "/api/docs/"})

    assert (response.status_code, response["Location"]) == (302, "/api/docs/")


def test_anonymous_visitors_of_home_are_sent_to_login(client: Client) -> None:
    response = client.get("/")

    assert (response.status_code, response["Location"]) == (302, "/login/?next=/")


def test_home_shows_the_users_projects_and_roles_and_nothing_of_another_tenant(client: Client) -> None:
    acme = make_tenant("acme")
    vision, nlp = make_project(acme, "vision"), make_project(acme, "nlp")
    make_project(acme, "robotics")
    globex = make_tenant("globex", admin=make_user("carol"))
    make_project(globex, "genomics")
    bob = make_user("bob")
    add_project_member(vision, bob, "member")
    add_project_member(nlp, bob, "viewer")
    client.force_login(bob)

    response = client.get("/")

    assert response.status_code == 200
    assert rows(response) == [("acme/nlp", "Viewer"), ("acme/vision", "Member")]
    assert [(row.item.slug, row.role) for row in response.context["tenant_rows"]] == [("acme", "Member")]
    page = response.content.decode()
    assert "acme_vision" in page
    assert "genomics" not in page
    assert "globex" not in page
    assert "robotics" not in page
    assert '<a href="/api/docs/">API documentation</a>' in page
    assert 'href="/admin/"' not in page
    assert EMPTY_STATE not in page


def test_a_tenant_admin_sees_all_the_tenants_projects(client: Client) -> None:
    alice = make_user("alice")
    acme = make_tenant("acme", admin=alice)
    add_project_member(make_project(acme, "vision"), alice, "manager")
    make_project(acme, "nlp")
    client.force_login(alice)

    response = client.get("/")

    assert rows(response) == [("acme/nlp", "Tenant admin (no project role)"), ("acme/vision", "Project manager")]
    assert [(row.item.slug, row.role) for row in response.context["tenant_rows"]] == [("acme", "Tenant admin")]


def test_home_tells_a_user_without_projects_whom_to_ask(client: Client) -> None:
    newcomer = make_user("newcomer")
    add_tenant_member(make_tenant("acme"), newcomer, "member")
    client.force_login(newcomer)

    response = client.get("/")

    assert response.status_code == 200
    assert rows(response) == []
    assert EMPTY_STATE in response.content.decode()


def test_portal_admins_see_every_project_and_the_admin_link(client: Client) -> None:
    make_project(make_tenant("acme"), "vision")
    make_project(make_tenant("globex"), "genomics")
    client.force_login(make_user("root", is_staff=True))

    response = client.get("/")

    assert rows(response) == [("acme/vision", "Portal admin"), ("globex/genomics", "Portal admin")]
    assert '<a href="/admin/">Admin</a>' in response.content.decode()


def test_logout_needs_a_post(client: Client) -> None:
    alice = make_user("alice")
    client.force_login(alice)

    assert client.get("/logout/").status_code == 405
    assert logged_in_user_id(client) == str(alice.pk)

    response = client.post("/logout/")

    assert (response.status_code, response["Location"]) == (302, "/login/")
    assert logged_in_user_id(client) is None
