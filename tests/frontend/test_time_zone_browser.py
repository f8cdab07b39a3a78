"""Times in the reader's zone in a real browser: Chromium in Tokyo sees a job's times in Tokyo time with no
profile setting (its zone reaches the portal through time-zone.js's cookie), then in Berlin time once the person
chooses Europe/Berlin on their profile page; the script that writes live times writes them as the server does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from playwright.sync_api import expect

from jobs.models import Job, JobState
from tenants.models import UserProfile
from tests.factories import make_job

pytestmark = [pytest.mark.django_db(transaction=True)]

SUBMITTED = datetime(2026, 7, 1, 13, 5, tzinfo=UTC)
NAVIGATION_TYPE = "performance.getEntriesByType('navigation')[0].type"


def test_a_job_shows_tokyo_time_in_a_tokyo_browser_then_berlin_time_once_chosen(
    open_page: Any, screenshot: Any
) -> None:
    job = make_job(name="zoned", state=JobState.COMPLETED)
    Job.objects.filter(pk=job.pk).update(created_at=SUBMITTED)
    accepted = "dt:text-is('Accepted') + dd time"

    page = open_page(job.user, timezone_id="Asia/Tokyo")
    page.goto(f"/jobs/{job.pk}/")
    # The first page was drawn in UTC, before the portal knew the browser's zone; it is drawn again in Tokyo's.
    expect(page.locator(accepted)).to_have_text("2026-07-01 22:05 UTC+09:00")
    expect(page.locator("body")).to_have_attribute("data-time-zone", "Asia/Tokyo")
    assert page.evaluate(NAVIGATION_TYPE) == "reload"
    assert page.evaluate("PortalTime.format('2026-07-01T13:05:00Z')") == "2026-07-01 22:05 UTC+09:00"
    assert not UserProfile.objects.filter(user=job.user).exists()
    screenshot(page, "job-in-tokyo")

    page.get_by_role("link", name="Profile").click()
    page.wait_for_url("**/account/profile/")
    zone = page.get_by_label("Time zone")
    expect(zone.locator("option[selected]")).to_have_text("Use my browser's time zone (Asia/Tokyo)")
    zone.select_option("Europe/Berlin")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_text("Times are now shown in Europe/Berlin.")).to_be_visible()
    screenshot(page, "profile-berlin")

    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator(accepted)).to_have_text("2026-07-01 15:05 UTC+02:00")
    expect(page.locator("body")).to_have_attribute("data-time-zone", "Europe/Berlin")
    # Live updates write times in the page's zone, the one chosen, not the browser's.
    assert page.evaluate("PortalTime.format('2026-07-01T13:05:00Z')") == "2026-07-01 15:05 UTC+02:00"
    assert page.evaluate("PortalTime.format('2026-11-26T23:30:00Z')") == "2026-11-27 00:30 UTC+01:00"
    screenshot(page, "job-in-berlin")


def test_a_browser_whose_zone_reads_as_utc_does_not_draw_the_first_page_again(open_page: Any) -> None:
    job = make_job(name="zoned", state=JobState.COMPLETED)
    Job.objects.filter(pk=job.pk).update(created_at=SUBMITTED)
    page = open_page(job.user, timezone_id="Africa/Abidjan")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("dt:text-is('Accepted') + dd time")).to_have_text("2026-07-01 13:05 UTC")
    # The zone is reported, but Abidjan's times read as UTC's (no offset, ever): the page was not drawn again.
    assert "portal_time_zone=Africa/Abidjan" in page.evaluate("document.cookie")
    assert page.evaluate(NAVIGATION_TYPE) == "navigate"
