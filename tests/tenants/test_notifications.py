"""A user's in-portal notifications through the REST API: their own only, newest first, marked read."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tenants.models import Notification
from tenants.notifications import notifications_send
from tests.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def alice() -> User:
    return make_user("alice")


def send(user: User, title: str) -> Notification:
    tenant = make_tenant()
    (notification,) = notifications_send(
        users=[user], tenant=tenant, kind="quota.threshold", title=title, body=f"{title}.", link="/api/v1/x/"
    )
    return notification


def test_a_user_lists_their_own_notifications_newest_first_with_the_unread_count(alice: User) -> None:
    first, second, third = send(alice, "first"), send(alice, "second"), send(alice, "third")
    send(make_user("bob"), "bob's")

    body: dict[str, Any] = client_for(alice).get("/api/v1/notifications/").json()

    assert (body["count"], body["unread_count"], body["next"], body["previous"]) == (3, 3, None, None)
    assert [item["title"] for item in body["results"]] == ["third", "second", "first"]
    assert body["results"][0] == {
        "id": third.pk,
        "kind": "quota.threshold",
        "tenant": third.tenant.slug if third.tenant else None,
        "title": "third",
        "body": "third.",
        "link": "/api/v1/x/",
        "created_at": body["results"][0]["created_at"],
        "read_at": None,
        "is_read": False,
    }

    read = client_for(alice).post(f"/api/v1/notifications/{second.pk}/read/")
    assert read.status_code == 200, read.content
    assert read.json()["is_read"] is True
    read_at = read.json()["read_at"]
    again = client_for(alice).post(f"/api/v1/notifications/{second.pk}/read/")
    assert again.json()["read_at"] == read_at  # reading twice keeps the first time

    unread = client_for(alice).get("/api/v1/notifications/?unread=true").json()
    assert (unread["count"], unread["unread_count"]) == (2, 2)
    assert [item["id"] for item in unread["results"]] == [third.pk, first.pk]
    read_only = client_for(alice).get("/api/v1/notifications/?unread=false").json()
    assert ([item["id"] for item in read_only["results"]], read_only["unread_count"]) == ([second.pk], 2)
    paged = client_for(alice).get("/api/v1/notifications/?page_size=2").json()
    assert (paged["count"], len(paged["results"]), paged["unread_count"]) == (3, 2, 2)
    assert paged["next"] is not None
    assert first.pk not in [item["id"] for item in paged["results"]]


def test_read_all_marks_only_the_users_own(alice: User) -> None:
    send(alice, "one")
    send(alice, "two")
    bobs = send(make_user("bob"), "bob's")

    response = client_for(alice).post("/api/v1/notifications/read-all/")

    assert response.json() == {"marked_read": 2, "unread_count": 0}
    assert client_for(alice).get("/api/v1/notifications/").json()["unread_count"] == 0
    assert client_for(alice).post("/api/v1/notifications/read-all/").json() == {"marked_read": 0, "unread_count": 0}
    bobs.refresh_from_db()
    assert bobs.read_at is None


def test_another_users_notification_is_404_like_a_missing_one(alice: User) -> None:
    bobs = send(make_user("bob"), "bob's")
    portal_admin = make_user("root", is_staff=True)

    for user in (alice, portal_admin):
        for notification_id in (bobs.pk, bobs.pk + 1000):
            response = client_for(user).post(f"/api/v1/notifications/{notification_id}/read/")
            assert response.status_code == 404
            assert response.json() == {
                "code": "not_found",
                "message": (
                    f"No notification {notification_id} exists among yours; list them with GET /api/v1/notifications/."
                ),
                "fields": {},
            }
        assert client_for(user).get("/api/v1/notifications/").json()["count"] == 0
    bobs.refresh_from_db()
    assert bobs.read_at is None


def test_notifications_need_a_login() -> None:
    response = APIClient().get("/api/v1/notifications/")

    assert response.status_code == 401
    assert set(response.json()) == {"code", "message", "fields"}
