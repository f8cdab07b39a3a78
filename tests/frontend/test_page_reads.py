"""What every signed-in page reads before its own content, through Django's test client: the session, the person
with their chosen time zone, and the navigation's reach and unread count, each by one prepared statement
(portal/sessions.py, tenants/backends.py `get_user`, tenants/selectors.py `user_reach_with_unread`), with the same
outcome as the ORM's reads: an expired session or a deactivated account is signed out, the page is drawn in the
profile's zone, and the badge counts only the person's own unread notifications."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.utils import timezone

from tenants.models import Notification, ProjectRole
from tenants.profiles import user_time_zone_set
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement the connection runs, as sent (a prepared one with its placeholders)."""
    ran: list[str] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        ran.append(str(sql))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield ran


def _signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _notify(user: User, title: str, *, read: bool = False) -> None:
    Notification.objects.create(user=user, kind="test", title=title, read_at=timezone.now() if read else None)


def test_a_page_reads_session_person_zone_and_navigation_in_three_statements() -> None:
    reader, other = make_user(), make_user()
    user_time_zone_set(user=reader, time_zone="Asia/Tokyo")
    _notify(reader, "one")
    _notify(reader, "two")
    _notify(reader, "seen", read=True)
    _notify(other, "not yours")  # another person's unread notification never counts
    client = _signed_in(reader)
    client.get("/clusters/")  # the first page after signing in stores the session once more

    with statements() as ran:
        page = client.get("/clusters/")

    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-time-zone="Asia/Tokyo"' in html, "drawn in the zone of the person's profile"
    assert 'class="count-badge">2<' in html, "two unread notifications of their own"
    assert "/billing/" not in html, "a plain member is not offered Billing"
    touching = {table: [sql for sql in ran if table in sql] for table in ("django_session", "auth_user")}
    assert len(touching["django_session"]) == 1
    assert len(touching["auth_user"]) == 1, "the person once, with their zone"
    assert [sql for sql in ran if "tenants_userprofile" in sql] == touching["auth_user"]
    reach = [sql for sql in ran if "tenants_notification" in sql]
    assert len(reach) == 1
    assert "tenants_tenantmembership" in reach[0]
    assert "tenants_projectmembership" in reach[0]


def test_the_navigation_offers_billing_to_a_manager_and_a_tenant_admin() -> None:
    tenant = make_tenant()
    project = make_project(tenant)
    manager, admin = make_user(), make_user()
    add_tenant_member(tenant, manager)
    add_project_member(project, manager, role=ProjectRole.MANAGER)
    add_tenant_member(tenant, admin, role="admin")

    for person in (manager, admin):
        html = _signed_in(person).get("/clusters/").content.decode()
        assert 'href="/billing/"' in html
    assert 'href="/requests/"' in _signed_in(admin).get("/clusters/").content.decode()
    assert 'href="/requests/"' not in _signed_in(manager).get("/clusters/").content.decode()


def _session_expired(person: User) -> None:
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))


def _account_deactivated(person: User) -> None:
    User.objects.filter(pk=person.pk).update(is_active=False)


@pytest.mark.parametrize("ending", [_session_expired, _account_deactivated])
def test_an_expired_session_or_a_deactivated_account_is_signed_out(ending: Callable[[User], None]) -> None:
    person = make_user()
    client = _signed_in(person)
    assert client.get("/clusters/").status_code == 200
    ending(person)

    page = client.get("/clusters/")

    assert page.status_code == 302
    assert page["Location"].startswith("/login/")


def test_a_zone_saved_on_the_profile_page_draws_the_next_page_in_it() -> None:
    person = make_user()
    client = _signed_in(person)
    assert 'data-time-zone="UTC"' in client.get("/clusters/").content.decode()

    user_time_zone_set(user=person, time_zone="Europe/Berlin")

    assert 'data-time-zone="Europe/Berlin"' in client.get("/clusters/").content.decode()
