"""Times in the reader's zone through Django's test client: which zone a page is drawn in (the profile's, else the
browser's cookie, else UTC; a cookie that names no zone is ignored), the profile page that sets it, and one job's
times drawn in two zones, 24-hour with their offset."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client

from frontend.time_zones import COOKIE_NAME
from jobs.models import Job, JobState
from tenants.models import UserProfile
from tenants.profiles import user_time_zone_set
from tests.factories import make_job, make_user

pytestmark = pytest.mark.django_db

# A summer afternoon in UTC: 15:05 in Berlin (summer time), 22:05 in Tokyo, 09:05 in New York.
SUBMITTED = datetime(2026, 7, 1, 13, 5, tzinfo=UTC)
TWELVE_HOUR = re.compile(r"\b[ap]\.?m\.?\b", re.IGNORECASE)


@pytest.fixture
def job() -> Job:
    job = make_job(name="zoned", state=JobState.COMPLETED)
    Job.objects.filter(pk=job.pk).update(created_at=SUBMITTED)
    job.refresh_from_db()
    return job


def _user(job: Job) -> User:
    assert job.user is not None
    return job.user


def _owner(job: Job) -> Client:
    client = Client()
    client.force_login(_user(job))
    return client


def _accepted(page: str) -> str:
    """The text of the job page's "Accepted" time."""
    match = re.search(r"<dt>Accepted</dt><dd><time datetime=\"([^\"]+)\">([^<]+)</time>", page)
    assert match is not None, "the job page shows when it was accepted"
    assert match.group(1) == "2026-07-01T13:05:00+00:00", "the machine-readable time stays ISO 8601 in UTC"
    return match.group(2)


def _body_zone(page: str) -> str:
    match = re.search(r"<body data-time-zone=\"([^\"]+)\"", page)
    assert match is not None
    return match.group(1)


def test_a_page_is_drawn_in_utc_without_a_profile_zone_or_a_cookie(job: Job) -> None:
    page = _owner(job).get(f"/jobs/{job.pk}/").content.decode()
    assert _accepted(page) == "2026-07-01 13:05 UTC"
    assert _body_zone(page) == "UTC"


def test_the_browsers_zone_from_the_cookie_is_used_without_a_profile_zone(job: Job) -> None:
    client = _owner(job)
    client.cookies[COOKIE_NAME] = "Asia/Tokyo"
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert _accepted(page) == "2026-07-01 22:05 UTC+09:00"
    assert _body_zone(page) == "Asia/Tokyo"
    assert 'data-time-zone-redraw="true"' in page


def test_the_profile_zone_beats_the_browsers_cookie(job: Job) -> None:
    user_time_zone_set(user=_user(job), time_zone="Europe/Berlin")
    client = _owner(job)
    client.cookies[COOKIE_NAME] = "Asia/Tokyo"
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert _accepted(page) == "2026-07-01 15:05 UTC+02:00"
    assert _body_zone(page) == "Europe/Berlin"
    # A zone the person chose is never drawn over by the browser's.
    assert "data-time-zone-redraw" not in page


@pytest.mark.parametrize("cookie", ["Mars/Olympus_Mons", "../../etc/passwd", "localtime", "", "asia/tokyo"])
def test_a_cookie_that_names_no_zone_is_ignored(job: Job, cookie: str) -> None:
    client = _owner(job)
    client.cookies[COOKIE_NAME] = cookie
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert _accepted(page) == "2026-07-01 13:05 UTC"
    assert _body_zone(page) == "UTC"


def test_one_job_drawn_in_two_zones_shows_each_zones_time_in_24_hours(job: Job) -> None:
    client = _owner(job)
    drawn = {}
    for zone in ("America/New_York", "Asia/Kolkata"):
        user_time_zone_set(user=_user(job), time_zone=zone)
        detail = client.get(f"/jobs/{job.pk}/").content.decode()
        listing = client.get("/jobs/").content.decode()
        drawn[zone] = _accepted(detail)
        # The list writes the same time the same way.
        assert f">{drawn[zone]}</time>" in listing
        assert TWELVE_HOUR.search(re.sub(r"<[^>]+>", " ", detail)) is None
    assert drawn == {
        "America/New_York": "2026-07-01 09:05 UTC-04:00",
        "Asia/Kolkata": "2026-07-01 18:35 UTC+05:30",
    }


def test_the_api_answers_in_utc_whatever_the_persons_zone(job: Job) -> None:
    user_time_zone_set(user=_user(job), time_zone="Asia/Tokyo")
    client = _owner(job)
    client.cookies[COOKIE_NAME] = "Asia/Tokyo"
    answer = client.get(f"/api/v1/jobs/{job.pk}/")
    assert answer.status_code == 200
    assert answer.json()["created_at"] == "2026-07-01T13:05:00Z"


# The profile page ------------------------------------------------------------------------------------------


def test_the_profile_page_offers_the_browsers_zone_first_and_every_iana_zone() -> None:
    client = Client()
    client.force_login(make_user())
    client.cookies[COOKIE_NAME] = "Asia/Tokyo"
    page = client.get("/account/profile/").content.decode()
    assert '<option value="" selected>Use my browser\'s time zone (Asia/Tokyo)</option>' in page
    assert "<option>Europe/Berlin</option>" in page
    assert "<option>localtime</option>" not in page
    assert 'href="/account/profile/"' in page, "the header's account area links to the profile"


def test_saving_a_zone_in_the_profile_keeps_it_and_shows_it_selected() -> None:
    user = make_user()
    client = Client()
    client.force_login(user)
    answer = client.post("/account/profile/", {"time_zone": "Europe/Berlin"})
    assert answer.status_code == 302
    assert answer["Location"] == "/account/profile/"
    assert UserProfile.objects.get(user=user).time_zone == "Europe/Berlin"
    page = client.get("/account/profile/").content.decode()
    assert "<option selected>Europe/Berlin</option>" in page
    assert "Times are now shown in Europe/Berlin." in page

    assert client.post("/account/profile/", {"time_zone": ""}).status_code == 302
    assert UserProfile.objects.get(user=user).time_zone == ""


@pytest.mark.parametrize("wanted", ["Mars/Olympus_Mons", "localtime", "Europe/../../etc/passwd"])
def test_a_zone_that_is_not_one_is_refused_next_to_the_field_and_nothing_is_saved(wanted: str) -> None:
    user = make_user()
    user_time_zone_set(user=user, time_zone="Europe/Berlin")
    client = Client()
    client.force_login(user)
    answer = client.post("/account/profile/", {"time_zone": wanted})
    assert answer.status_code == 400
    page = answer.content.decode()
    assert f"{wanted!r} is not a time zone: pick one from the list." in page.replace("&#x27;", "'")
    assert 'aria-invalid="true"' in page
    assert UserProfile.objects.get(user=user).time_zone == "Europe/Berlin"


def test_the_profile_page_is_for_signed_in_people_only() -> None:
    answer = Client().get("/account/profile/")
    assert answer.status_code == 302
    assert answer["Location"].startswith("/login/")
    assert Client().post("/account/profile/", {"time_zone": "Europe/Berlin"}).status_code == 302
    assert UserProfile.objects.count() == 0
