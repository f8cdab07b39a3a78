"""The REST API for tenants, projects, members, tokens and the audit log, through HTTP as clients use it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tenants.models import ApiToken, AuditEvent, Project, ProjectMembership, TenantMembership
from tests.factories import PASSWORD, add_project_member, add_tenant_member, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def call(client: Client, method: str, url: str, body: dict[str, Any] | None = None, **headers: Any) -> Any:
    return client.generic(
        method, url, data=json.dumps(body) if body is not None else "", content_type="application/json", **headers
    )


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def assert_error(response: Any, status: int, field: str | None = None, says: str = "") -> dict[str, Any]:
    assert response.status_code == status, response.content
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert body["message"]
    if field is not None:
        assert list(body["fields"]) == [field]
        assert says in body["fields"][field][0]
        assert says in body["message"]
    return body


@pytest.fixture
def acme() -> dict[str, Any]:
    admin = make_user("ada")
    tenant = make_tenant("acme", admin=admin)
    vision = make_project(tenant, "vision")
    bob = make_user("bob")
    add_project_member(vision, bob, "member")
    return {"admin": admin, "tenant": tenant, "vision": vision, "bob": bob}


# Tenants and projects -----------------------------------------------------------------------------------


def test_a_tenant_admin_creates_a_project_with_a_stable_slurm_account(acme: dict[str, Any]) -> None:
    client = logged_in(acme["admin"])
    response = call(
        client, "POST", "/api/v1/tenants/acme/projects/", {"slug": "nlp", "name": "Language", "description": "LLMs"}
    )
    assert response.status_code == 201
    assert response.json() | {"created_at": None} == {
        "tenant": "acme",
        "slug": "nlp",
        "name": "Language",
        "description": "LLMs",
        "slurm_account": "acme_nlp",
        "my_role": None,
        "members": [],
        "created_at": None,
    }
    renamed = call(client, "PATCH", "/api/v1/tenants/acme/projects/nlp/", {"name": "NLP"})
    assert renamed.json()["name"] == "NLP"
    assert renamed.json()["slurm_account"] == "acme_nlp"
    events = list(AuditEvent.objects.filter(target_type="Project", target_label="acme/nlp").order_by("id"))
    assert [event.action for event in events] == ["project.created", "project.updated"]
    assert events[1].actor_username == "ada"
    assert (events[1].before or {})["name"] == "Language"
    assert (events[1].after or {})["name"] == "NLP"


def test_project_detail_lists_members_with_roles(acme: dict[str, Any]) -> None:
    response = call(logged_in(acme["bob"]), "GET", "/api/v1/tenants/acme/projects/vision/")
    assert response.status_code == 200
    body = response.json()
    assert body["my_role"] == "member"
    assert [(member["username"], member["role"]) for member in body["members"]] == [("bob", "member")]


def test_project_list_is_paginated_and_filterable(acme: dict[str, Any]) -> None:
    for index in range(5):
        make_project(acme["tenant"], f"extra{index}")
    client = logged_in(acme["admin"])
    page = call(client, "GET", "/api/v1/projects/?page_size=2&page=2").json()
    assert page["count"] == 6
    assert [project["slug"] for project in page["results"]] == ["extra2", "extra3"]
    assert page["next"].endswith("page=3&page_size=2")
    assert call(client, "GET", "/api/v1/projects/?search=VIS").json()["count"] == 1
    bob_projects = call(logged_in(acme["bob"]), "GET", "/api/v1/projects/?role=member").json()
    assert [project["slug"] for project in bob_projects["results"]] == ["vision"]
    assert call(logged_in(acme["bob"]), "GET", "/api/v1/projects/?role=manager").json()["count"] == 0


def test_tenant_list_shows_counts_and_my_role(acme: dict[str, Any]) -> None:
    body = call(logged_in(acme["bob"]), "GET", "/api/v1/tenants/").json()
    assert body["count"] == 1
    tenant = body["results"][0]
    assert (tenant["slug"], tenant["my_role"], tenant["project_count"], tenant["member_count"]) == (
        "acme",
        "member",
        1,
        2,
    )


def test_me_shows_roles_and_cluster_usernames(acme: dict[str, Any]) -> None:
    from clusters.models import Cluster, ClusterAccount

    cluster = Cluster.objects.create(
        name="local", slurmrestd_url="http://127.0.0.1:6820", jwt_key_file="/x", log_root="/srv", admin_user="root"
    )
    ClusterAccount.objects.create(cluster=cluster, user=acme["bob"], username="bob")
    body = call(logged_in(acme["bob"]), "GET", "/api/v1/me/").json()
    assert body["tenants"] == [{"tenant": "acme", "name": "Test tenant", "role": "member"}]
    assert body["projects"] == [{"tenant": "acme", "project": "vision", "name": "Test project", "role": "member"}]
    assert body["cluster_accounts"] == [{"cluster": "local", "username": "bob"}]
    assert body["is_portal_admin"] is False


# Memberships --------------------------------------------------------------------------------------------


def test_member_lifecycle_through_the_api(acme: dict[str, Any]) -> None:
    make_user("carl")
    client = logged_in(acme["admin"])
    assert call(client, "POST", "/api/v1/tenants/acme/members/", {"username": "carl"}).json()["role"] == "member"
    added = call(
        client, "POST", "/api/v1/tenants/acme/projects/vision/members/", {"username": "carl", "role": "viewer"}
    )
    assert added.status_code == 201
    changed = call(client, "PATCH", "/api/v1/tenants/acme/projects/vision/members/carl/", {"role": "manager"})
    assert changed.json()["role"] == "manager"
    assert call(client, "DELETE", "/api/v1/tenants/acme/members/carl/").status_code == 204
    assert not TenantMembership.objects.filter(user__username="carl").exists()
    assert not ProjectMembership.objects.filter(user__username="carl").exists()
    actions = list(
        AuditEvent.objects.filter(target_label__contains="carl").order_by("id").values_list("action", flat=True)
    )
    assert actions == [
        "tenant_member.added",
        "project_member.added",
        "project_member.role_changed",
        "project_member.removed",
        "tenant_member.removed",
    ]


def test_a_project_manager_manages_members_but_not_the_tenant(acme: dict[str, Any]) -> None:
    manager = make_user("mia")
    add_project_member(acme["vision"], manager, "manager")
    client = logged_in(manager)
    assert (
        call(client, "PATCH", "/api/v1/tenants/acme/projects/vision/members/bob/", {"role": "viewer"}).status_code
        == 200
    )
    denied = call(client, "POST", "/api/v1/tenants/acme/projects/", {"slug": "other", "name": "Other"})
    body = assert_error(denied, 403)
    assert (
        body["message"]
        == "This needs the tenant role 'admin' in tenant 'acme'; you are 'member'. Ask one of the tenant's admins."
    )
    assert not Project.objects.filter(slug="other").exists()


def test_a_viewer_is_told_which_role_is_missing(acme: dict[str, Any]) -> None:
    viewer = make_user("vic")
    add_project_member(acme["vision"], viewer, "viewer")
    response = call(logged_in(viewer), "DELETE", "/api/v1/tenants/acme/projects/vision/members/bob/")
    body = assert_error(response, 403)
    assert body["code"] == "permission_denied"
    assert body["message"] == (
        "This needs the project role 'manager', or the tenant role 'admin' in 'acme' in project 'acme/vision'; "
        "you are 'viewer'."
    )
    assert ProjectMembership.objects.filter(project=acme["vision"], user=acme["bob"]).exists()


# Bad input: each a 400 saying what to do ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"slug": "vision", "name": "Again"}, "slug", "already has a project 'vision'; choose another slug"),
        ({"slug": "Bad_Slug", "name": "x"}, "slug", "lower-case letters, digits and single hyphens"),
        ({"slug": "a", "name": "x"}, "slug", "2 to 40"),
        ({"slug": "ends-", "name": "x"}, "slug", "not ending with a hyphen"),
        ({"slug": "ok-slug", "name": "   "}, "name", "A name is required"),
        ({"name": "No slug"}, "slug", "This field is required."),
    ],
)
def test_bad_project_input_is_a_400_saying_what_to_do(
    acme: dict[str, Any], body: dict[str, Any], field: str, says: str
) -> None:
    before = Project.objects.count()
    response = call(logged_in(acme["admin"]), "POST", "/api/v1/tenants/acme/projects/", body)
    assert_error(response, 400, field, says)
    assert Project.objects.count() == before


def test_a_duplicate_tenant_slug_is_refused() -> None:
    staff = make_user("root-admin", is_staff=True)
    make_tenant("taken")
    response = call(logged_in(staff), "POST", "/api/v1/tenants/", {"slug": "taken", "name": "Again"})
    assert_error(response, 400, "slug", "A tenant 'taken' already exists; choose another slug.")


def test_an_unknown_user_is_refused(acme: dict[str, Any]) -> None:
    response = call(logged_in(acme["admin"]), "POST", "/api/v1/tenants/acme/members/", {"username": "nobody"})
    assert_error(response, 400, "username", "There is no active user 'nobody'")


def test_a_role_that_does_not_exist_is_refused(acme: dict[str, Any]) -> None:
    client = logged_in(acme["admin"])
    response = call(client, "PATCH", "/api/v1/tenants/acme/projects/vision/members/bob/", {"role": "owner"})
    assert_error(response, 400, "role", "'owner' is not a role here; use one of 'manager', 'member', 'viewer'.")
    response = call(client, "PATCH", "/api/v1/tenants/acme/members/bob/", {"role": "manager"})
    assert_error(response, 400, "role", "use one of 'admin', 'member'.")
    assert ProjectMembership.objects.get(user=acme["bob"]).role == "member"


def test_the_last_tenant_admin_can_be_neither_removed_nor_demoted(acme: dict[str, Any]) -> None:
    client = logged_in(acme["admin"])
    says = "'ada' is the last admin of tenant 'acme'; make another member an admin before"
    assert_error(call(client, "DELETE", "/api/v1/tenants/acme/members/ada/"), 400, "role", says)
    assert_error(call(client, "PATCH", "/api/v1/tenants/acme/members/ada/", {"role": "member"}), 400, "role", says)
    assert TenantMembership.objects.get(user=acme["admin"]).role == "admin"
    # With a second admin, the first may step down.
    assert call(client, "PATCH", "/api/v1/tenants/acme/members/bob/", {"role": "admin"}).status_code == 200
    assert call(client, "DELETE", "/api/v1/tenants/acme/members/ada/").status_code == 204


def test_a_project_member_must_belong_to_the_tenant(acme: dict[str, Any]) -> None:
    make_user("stranger")
    response = call(
        logged_in(acme["admin"]), "POST", "/api/v1/tenants/acme/projects/vision/members/", {"username": "stranger"}
    )
    assert_error(
        response, 400, "username", "'stranger' is not a member of tenant 'acme'; add them to the tenant first."
    )


def test_malformed_json_and_unknown_routes_keep_the_error_shape(acme: dict[str, Any]) -> None:
    client = logged_in(acme["admin"])
    response = client.post("/api/v1/tenants/acme/projects/", data="{not json", content_type="application/json")
    assert_error(response, 400)
    assert response.json()["code"] == "parse_error"
    assert_error(client.get("/api/v1/no-such-thing/"), 404)
    assert_error(client.get("/api/v1/projects/?page=99"), 404)
    assert_error(call(client, "PUT", "/api/v1/tenants/acme/"), 405)


# Tokens -------------------------------------------------------------------------------------------------


def test_a_token_from_username_and_password_works_as_bearer_and_is_stored_hashed(acme: dict[str, Any]) -> None:
    expires = (timezone.now() + timedelta(days=30)).isoformat()
    response = call(
        Client(),
        "POST",
        "/api/v1/tokens/",
        {"name": "ci", "username": "bob", "password": PASSWORD, "expires_at": expires},
    )
    assert response.status_code == 201
    secret = response.json()["token"]
    stored = ApiToken.objects.get(name="ci")
    assert secret.startswith("gpp_")
    assert secret not in (stored.secret_hash, stored.prefix)
    assert secret.startswith(stored.prefix)
    bearer: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert call(Client(), "GET", "/api/v1/me/", **bearer).json()["username"] == "bob"
    listed = call(Client(), "GET", "/api/v1/tokens/", **bearer).json()["results"]
    assert [(token["name"], "token" in token) for token in listed] == [("ci", False)]
    # A token cannot mint more tokens.
    assert_error(call(Client(), "POST", "/api/v1/tokens/", {"name": "more"}, **bearer), 403)
    # Revoked: refused at once.
    assert call(Client(), "DELETE", f"/api/v1/tokens/{stored.pk}/", **bearer).status_code == 204
    refused = assert_error(call(Client(), "GET", "/api/v1/me/", **bearer), 401)
    assert refused["message"].startswith("This token is unknown, expired or revoked")
    assert list(AuditEvent.objects.filter(target_type="ApiToken").values_list("action", flat=True).order_by("id")) == [
        "token.created",
        "token.revoked",
    ]


def test_expired_tokens_and_wrong_passwords_are_refused(acme: dict[str, Any]) -> None:
    from tenants.services import token_create

    token, secret = token_create(user=acme["bob"], name="short", expires_at=timezone.now() + timedelta(seconds=30))
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(call(Client(), "GET", "/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}"), 401)
    wrong = call(Client(), "POST", "/api/v1/tokens/", {"name": "x", "username": "bob", "password": "nope"})
    assert assert_error(wrong, 401)["message"].startswith("Wrong username or password")
    past = call(
        logged_in(acme["bob"]), "POST", "/api/v1/tokens/", {"name": "old", "expires_at": "2000-01-01T00:00:00Z"}
    )
    assert_error(past, 400, "expires_at", "The expiry is in the past")
    assert call(Client(), "POST", "/api/v1/tokens/", {"name": "x"}).status_code == 401


def test_password_guessing_on_the_token_endpoint_is_throttled(acme: dict[str, Any], settings: Any) -> None:
    from django.core.cache import cache

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"login": "10/min"}}
    settings.LOGIN_ACCOUNT_FREE_FAILURES = 5
    cache.clear()

    def guess(username: str, password: str, **headers: str) -> Any:
        return call(
            Client(), "POST", "/api/v1/tokens/", {"name": "x", "username": username, "password": password}, **headers
        )

    # One account from one address: five wrong passwords, then a wait before each further try.
    one_account = [guess("bob", f"guess{i}").status_code for i in range(7)]
    # Other accounts from the same address: the address's ten wrong passwords a minute, then 429.
    many_accounts = [guess(f"someone{i}", "guess").status_code for i in range(7)]

    assert one_account == [401] * 5 + [429] * 2
    assert many_accounts == [401] * 5 + [429] * 2
    # A forged X-Forwarded-For does not buy fresh attempts.
    forged = guess("carol", "guess", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert forged.status_code == 429
    assert forged.json()["message"].startswith("Too many wrong passwords came from your address")
    cache.clear()


def test_with_local_passwords_off_the_token_endpoint_checks_no_password(acme: dict[str, Any], settings: Any) -> None:
    from tenants.backends import LOCAL_PASSWORDS_OFF

    settings.PORTAL_LOCAL_PASSWORDS = False

    right = call(Client(), "POST", "/api/v1/tokens/", {"name": "x", "username": "bob", "password": PASSWORD})
    nothing = call(Client(), "POST", "/api/v1/tokens/", {"name": "x"})
    signed_in = call(logged_in(acme["bob"]), "POST", "/api/v1/tokens/", {"name": "from-a-session"})

    assert assert_error(right, 403) == {"code": "permission_denied", "message": LOCAL_PASSWORDS_OFF, "fields": {}}
    assert assert_error(nothing, 401)["message"].startswith(LOCAL_PASSWORDS_OFF)
    assert signed_in.status_code == 201  # a browser session (e.g. from single sign-on) still makes tokens
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["from-a-session"]


def test_session_clients_need_csrf_for_writes(acme: dict[str, Any]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(acme["bob"])
    response = call(client, "POST", "/api/v1/tokens/", {"name": "no-csrf"})
    assert assert_error(response, 403)["message"].startswith("CSRF Failed")
    assert not ApiToken.objects.filter(name="no-csrf").exists()


# Audit log ----------------------------------------------------------------------------------------------


def test_tenant_admins_read_their_tenant_audit_log_and_no_other(acme: dict[str, Any]) -> None:
    other_admin = make_user("olga")
    make_project(make_tenant("globex", admin=other_admin), "genomics")
    events = call(logged_in(acme["admin"]), "GET", "/api/v1/audit-events/").json()
    assert {event["tenant"] for event in events["results"]} == {"acme"}
    assert events["count"] == AuditEvent.objects.filter(tenant=acme["tenant"]).count()
    filtered = call(logged_in(acme["admin"]), "GET", "/api/v1/audit-events/?action=project.created").json()
    assert [event["target_label"] for event in filtered["results"]] == ["acme/vision"]
    assert_error(call(logged_in(acme["admin"]), "GET", "/api/v1/audit-events/?tenant=globex"), 404)
    assert_error(call(logged_in(acme["bob"]), "GET", "/api/v1/audit-events/?tenant=acme"), 403)
    assert call(logged_in(acme["bob"]), "GET", "/api/v1/audit-events/").json()["count"] == 0
    staff = make_user("root-admin", is_staff=True)
    assert call(logged_in(staff), "GET", "/api/v1/audit-events/?tenant=globex").json()["count"] == 3


def test_the_schema_documents_every_route_and_the_error_shape() -> None:
    schema = Client().get("/api/schema/?format=json").json()
    assert "/api/v1/tokens/" in schema["paths"]
    assert "/api/v1/tenants/{tenant}/projects/{project}/members/{username}/" in schema["paths"]
    assert set(schema["components"]["schemas"]["Error"]["properties"]) == {"code", "message", "fields"}
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from POST /api/v1/tokens/, or an access token (JWT) of a configured OpenID "
        "provider for the portal's API audience.",
    }
    docs = Client().get("/api/docs/").content.decode()
    assert "cdn" not in docs.lower()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in docs
    assert Client().get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js").status_code == 200


def test_tenant_members_outside_a_project_are_told_they_have_no_role(acme: dict[str, Any]) -> None:
    newcomer = make_user("nina")
    add_tenant_member(acme["tenant"], newcomer)
    body = assert_error(call(logged_in(newcomer), "GET", "/api/v1/tenants/acme/projects/vision/"), 403)
    assert body["message"].endswith("in project 'acme/vision'; you have no role in it.")


@pytest.mark.parametrize(
    "url",
    ["/api/v1/tenants/", "/api/v1/projects/", "/api/v1/tenants/acme/members/", "/api/v1/audit-events/"],
)
def test_list_queries_do_not_grow_with_the_rows(
    acme: dict[str, Any], url: str, django_assert_max_num_queries: Any
) -> None:
    client = logged_in(acme["admin"])
    client.get(url)  # warm the session
    with django_assert_max_num_queries(100) as few:
        assert client.get(url).status_code == 200
    for index in range(10):
        project = make_project(acme["tenant"], f"more{index}")
        add_project_member(project, make_user(f"extra{index}"), "member")
        make_tenant(f"other{index}", admin=acme["admin"])
    with django_assert_max_num_queries(len(few.captured_queries)) as many:
        assert client.get(url).status_code == 200
    assert len(many.captured_queries) == len(few.captured_queries)
