"""A running job's duration and cost count up in a real browser without a reload, on the jobs list and on the
job's page, and stop where the job ended when its end arrives over the WebSocket (as its state does)."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing.rates import rate_create
from jobs.job_services import jobs_push
from jobs.models import Job, JobState
from tests.conftest import SentTask
from tests.frontend.test_job_pages import make_shop

pytestmark = [pytest.mark.django_db(transaction=True)]

DURATION = re.compile(r"\d+:\d\d:\d\d")
COST = re.compile(r"\d+\.\d\d EUR")


@pytest.fixture(autouse=True)
def no_broker(sent_tasks: list[SentTask]) -> None:
    """Submitting queues the job's delivery after commit; no worker runs here: the test moves the job itself."""


def _running_job(tmp_path: Path) -> tuple[Any, Job]:
    shop = make_shop(tmp_path)
    # 36 EUR per GPU-hour on its type: 2 GPUs cost 0.02 EUR a second, so the cost moves every second.
    rate_create(
        actor=None,
        cluster=shop.cluster,
        gpu_type="h100",
        price_per_gpu_hour=Decimal("36.00"),
        currency="EUR",
        valid_from=timezone.now() - timedelta(days=1),
    )
    job = shop.submit(name="counting")
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING,
        gpus=2,
        gpu_type="h100",
        slurm_job_id=4242,
        started_at=timezone.now() - timedelta(minutes=5),
        updated_at=timezone.now(),
    )
    job.refresh_from_db()
    return shop, job


def _watch_count_up(page: Any, scope: Any) -> None:
    """Both figures change while the page stays the same document; wait on each change, no sleeps."""
    duration = scope.locator("[data-field='duration']")
    cost = scope.locator("[data-field='cost']")
    expect(duration).to_have_text(DURATION)
    expect(cost).to_have_text(COST)
    first_duration, first_cost = duration.inner_text(), cost.inner_text()
    expect(duration).not_to_have_text(first_duration)
    expect(cost).not_to_have_text(first_cost)
    assert DURATION.fullmatch(duration.inner_text())
    assert COST.fullmatch(cost.inner_text())
    assert page.evaluate("window.__sameDocument") is True


def test_a_running_jobs_duration_and_cost_count_up_live_on_the_list_and_its_page(
    open_page: Any, screenshot: Any, tmp_path: Path
) -> None:
    shop, job = _running_job(tmp_path)
    listing = open_page(shop.users["viewer"])
    listing.goto("/jobs/")
    listing.wait_for_selector("#jobs-live-status[data-state='live']")
    listing.evaluate("window.__sameDocument = true")
    row = listing.locator(f"tr[data-job-id='{job.pk}']")
    _watch_count_up(listing, row)
    screenshot(listing, "list-running-counts-up")

    page = open_page(shop.users["viewer"])
    page.goto(f"/jobs/{job.pk}/")
    page.wait_for_selector("#job-live-status[data-state='live']")
    page.evaluate("window.__sameDocument = true")
    facts = page.locator("#job-live")
    expect(facts.get_by_text("Cost so far")).to_be_visible()
    _watch_count_up(page, facts)
    screenshot(page, "job-running-counts-up")

    # The job ends: the list's row stops at its end, where Slurm's times put it (exactly 10 minutes, 2 GPUs).
    assert job.started_at is not None
    Job.objects.filter(pk=job.pk).update(
        state=JobState.COMPLETED,
        ended_at=job.started_at + timedelta(minutes=10),
        exit_code=0,
        updated_at=timezone.now(),
    )
    jobs_push([job.pk])
    expect(row.locator("[data-field='state']")).to_have_text("Completed")
    expect(row.locator("[data-field='duration']")).to_have_text("0:10:00")
    expect(row.locator("[data-field='cost']")).to_have_text("12.00 EUR")  # 2 GPUs x 1/6 h x 36 EUR
    expect(row.locator("[data-field='exit_code']")).to_have_text("0")
    # The job's page redraws from the server: the duration of the run, its cost once Slurm's accounting is priced.
    expect(page.locator("#job-state")).to_have_text("Completed")
    expect(page.locator("#job-live [data-field='duration']")).to_have_text("0:10:00")
    assert listing.evaluate("window.__sameDocument") is True
    assert page.evaluate("window.__sameDocument") is True
    screenshot(listing, "list-ended")
    screenshot(page, "job-ended")
