"""Browser login, logout and the home page: CSRF, errors, redirects, and only the user's own tenant data."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from portal.env import oidc_providers
from tenants.backends import LOCAL_PASSWORDS_OFF
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


def test_the_login_page_offers_a_button_for_each_sign_in_provider(client: Client, settings: Any) -> None:
    providers = [
        {"id": "university", "name": "Example University", "server_url": "https://login.uni.example", "client_id": "a"},
        {"id": "company", "name": "Example Corp", "server_url": "https://sso.corp.example/", "client_id": "b"},
    ]
    settings.SOCIALACCOUNT_PROVIDERS = {
        "openid_connect": {
            **settings.SOCIALACCOUNT_PROVIDERS["openid_connect"],
            "APPS": oidc_providers(json.dumps(providers)),
        }
    }

    page = " ".join(client.get("/login/?next=/jobs/").content.decode().split())

    buttons = re.findall(
        r'<form method="post" action="([^"]+)">.*?name="next" value="([^"]*)".*?>Sign in with ([^<]+)<', page
    )
    assert buttons == [
        ("/oidc/university/login/", "/jobs/", "Example University"),
        ("/oidc/company/login/", "/jobs/", "Example Corp"),
    ]
    assert '<p class="sign-in-or">or with a portal password</p>' in page
    assert '<label for="id_password">Password</label>' in page


def test_with_local_passwords_off_the_form_is_gone_and_no_password_is_checked(client: Client, settings: Any) -> None:
    settings.PORTAL_LOCAL_PASSWORDS = False
    alice = make_user("alice")

    page = " ".join(client.get("/login/").content.decode().split())
    refused = client.post("/login/", {"username": "alice", "password": PASSWORD})
    admin = client.post("/admin/login/", {"username": alice.username, "password": PASSWORD, "next": "/admin/"})

    assert 'name="password"' not in page
    assert "Passwords are not used on this portal: sign in through your organisation above." in page
    assert refused.status_code == 403
    assert f'<div class="form-errors" role="alert"><p>{escape(LOCAL_PASSWORDS_OFF)}</p></div>' in " ".join(
        refused.content.decode().split()
    )
    assert 'name="password"' not in refused.content.decode()
    assert admin.status_code == 200  # the admin's form shown again: its password was not checked either
    assert logged_in_user_id(client) is None
