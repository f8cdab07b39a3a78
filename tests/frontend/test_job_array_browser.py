"""A job array in a real browser on the real stack (uvicorn, Celery worker and beat, the local Slurm cluster):
submitted from the array template, its progress live in the list, its tasks on its page, one task's log."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from jobs.models import Job, JobState
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)

pytestmark = [pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT_MS = 120_000


def test_an_array_from_the_template_shows_its_progress_live_its_tasks_and_a_tasks_log(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
) -> None:
    watcher = open_page(live_project.member)
    watcher.goto("/jobs/")
    watcher.wait_for_selector("#jobs-live-status[data-state='live']")

    page = open_page(live_project.member)
    page.goto("/jobs/new/")
    page.get_by_role("link", name="Parameter sweep as a job array").click()
    page.wait_for_url("**template=array-sweep")
    array = page.get_by_label("Array (optional)")
    assert array.input_value() == "0-7%4"
    array.fill("0-3%2")
    page.get_by_label("Time limit (minutes)").fill("5")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
    job = Job.objects.get(name="Parameter sweep as a job array")
    assert (job.array, job.array_task_count) == ("0-3%2", 4)

    # The list, open since before the submission, shows the array and its progress change without a reload.
    watcher.reload()  # the row of a job delivered before the list connected; its progress then moves live
    watcher.wait_for_selector("#jobs-live-status[data-state='live']")
    progress = watcher.locator(f"tr[data-job-id='{job.pk}'] [data-field='array_progress']")
    expect(progress).to_have_text("4 done, 0 failed, 0 running, 0 pending", timeout=LIVE_TIMEOUT_MS)
    screenshot(watcher, "array-list-done")
    assert Job.objects.get(pk=job.pk).state == JobState.COMPLETED

    # The job's page, open since the submission, shows its tasks end without a reload.
    tasks = page.get_by_role("table", name="Tasks")
    expect(tasks.locator("tbody tr")).to_have_count(4)
    expect(tasks.locator("tbody tr .badge-completed")).to_have_count(4, timeout=LIVE_TIMEOUT_MS)
    tasks.locator("tbody tr").nth(2).get_by_role("link", name="log").click()
    page.wait_for_url("**task=2#log-viewer")
    expect(page.get_by_role("heading", name="Output of task 2")).to_be_visible()
    terminal = page.locator("#terminal-stdout")
    expect(terminal).to_contain_text(f"task 2 of array {job.slurm_job_id}: lr=0.03", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator("#log-status")).to_contain_text("The job has ended", timeout=LIVE_TIMEOUT_MS)
    screenshot(page, "array-task-log")
