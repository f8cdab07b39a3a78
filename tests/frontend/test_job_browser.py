"""The jobs journeys in a real browser on the real stack (uvicorn, Celery worker and beat, the local Slurm
cluster): submit from a template and watch the list change without reloading, read a running job's log live,
cancel a running job from its page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from jobs.models import Job, JobState
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)

pytestmark = [pytest.mark.django_db(transaction=True)]

# A job that prints lines, a carriage-return progress bar and a line on stderr, over about ten seconds.
PROGRESS_SCRIPT = r"""#!/bin/bash
echo "starting on $(hostname)"
for pct in 10 20 30 40 50 60 70 80 90 100; do printf '\rprogress %3d%%' "$pct"; sleep 0.3; done
printf '\n'
for i in $(seq 1 40); do echo "line $i"; sleep 0.2; done
echo "something went sideways" >&2
echo "done"
"""
LIVE_TIMEOUT_MS = 120_000


def test_a_job_submitted_from_a_template_appears_and_completes_in_the_list_without_reloading(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
) -> None:
    watcher = open_page(live_project.member)
    watcher.goto("/jobs/")
    watcher.wait_for_selector("#jobs-live-status[data-state='live']")
    assert watcher.get_by_text("No jobs yet.").is_visible()
    watcher.evaluate("window.__sameDocument = true")
    screenshot(watcher, "list-empty")

    page = open_page(live_project.member)
    page.goto("/jobs/new/")
    page.get_by_role("link", name="GPU smoke test").click()
    page.wait_for_url("**template=gpu-smoke-test")
    assert "GPU smoke test" in page.get_by_label("Name").input_value()
    assert page.get_by_label("Batch script").input_value().startswith("#!/bin/bash\n# A quick check")
    page.get_by_label("Name").fill("smoke from the browser")
    estimate = page.locator("#estimate .estimate-message")
    estimate.wait_for()
    assert estimate.inner_text().startswith("At most 0.08 GPU-hours on any GPU type")
    # Typing a value and leaving the field ("change") asks for a new estimate.
    page.get_by_label("GPUs").fill("2")
    page.get_by_label("GPUs").press("Tab")
    expect(estimate).to_contain_text("At most 0.17 GPU-hours")
    page.get_by_label("GPUs").fill("1")
    page.get_by_label("GPUs").press("Tab")
    expect(estimate).to_contain_text("At most 0.08 GPU-hours")
    screenshot(page, "submit-from-template")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    assert page.get_by_text("Job “smoke from the browser” was accepted").is_visible()
    job = Job.objects.get(name="smoke from the browser")
    assert job.template_id == "gpu-smoke-test"

    # The list that was open all along shows the new job, then its states, with no reload.
    row = watcher.locator(f'tr[data-job-id="{job.pk}"]')
    row.wait_for(timeout=LIVE_TIMEOUT_MS)
    badge = row.locator("[data-field='state']")
    first_state = badge.inner_text()
    assert first_state in {"Queued", "Pending", "Running"}
    screenshot(watcher, f"list-{first_state.lower()}")
    expect(badge).to_have_text("Completed", timeout=LIVE_TIMEOUT_MS)
    assert badge.get_attribute("class") == "badge badge-completed"
    # Its duration stopped where the job ended (the list has a duration column, no separate end time).
    expect(row.locator("[data-field='duration']")).to_have_attribute("data-ended-at", re.compile(r"\d{4}-\d\d-\d\dT"))
    expect(row.locator("[data-field='duration']")).to_have_text(re.compile(r"^\d+:\d\d:\d\d$"))
    assert watcher.evaluate("window.__sameDocument") is True
    assert not watcher.locator("#jobs-empty").is_visible()
    screenshot(watcher, "list-completed")


def test_a_running_jobs_log_streams_live_with_follow_pause_and_download(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
    tmp_path: Path,
) -> None:
    reply = live_project.submit(
        name="progress", script=PROGRESS_SCRIPT, partition="debug", gpu_type="", time_limit_minutes=5
    )
    page = open_page(live_project.member, viewport="phone")
    page.goto(f"/jobs/{reply['id']}/")
    terminal = page.locator("#terminal-stdout")
    expect(terminal).to_contain_text("line 1", timeout=LIVE_TIMEOUT_MS)
    # The progress bar was redrawn in place: one line, at its last value.
    lines = terminal.locator(".term-line")
    assert lines.nth(0).inner_text().startswith("starting on ")
    assert lines.nth(1).inner_text() == "progress 100%"
    assert "progress  10%" not in terminal.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "log-following")

    # Enough lines to overflow the terminal's box, so that scrolling means something.
    expect(terminal).to_contain_text("line 25", timeout=LIVE_TIMEOUT_MS)
    at_bottom = "element => element.scrollTop + element.clientHeight >= element.scrollHeight - 2"
    assert terminal.evaluate("element => element.scrollHeight > element.clientHeight")
    assert terminal.evaluate(at_bottom)
    follow = page.get_by_role("button", name="Follow")
    assert follow.get_attribute("aria-pressed") == "true"
    follow.click()
    assert follow.get_attribute("aria-pressed") == "false"
    assert "paused" in page.locator("#log-status").inner_text()
    terminal.evaluate("element => { element.scrollTop = 0; }")
    count = lines.count()
    expect(lines.nth(count + 3)).to_be_attached(timeout=LIVE_TIMEOUT_MS)
    # Paused: output kept coming in, the view stayed where the reader put it.
    assert terminal.evaluate("element => element.scrollTop") == 0
    screenshot(page, "log-paused")
    follow.click()
    assert follow.get_attribute("aria-pressed") == "true"
    assert terminal.evaluate(at_bottom)

    expect(page.locator("#log-status")).to_contain_text("The job has ended", timeout=LIVE_TIMEOUT_MS)
    assert "line 40\ndone" in terminal.inner_text()
    page.get_by_role("button", name="stderr").click()
    assert page.get_by_role("button", name="stderr").get_attribute("aria-pressed") == "true"
    assert page.locator("#terminal-stderr").is_visible()
    assert not terminal.is_visible()
    assert page.locator("#terminal-stderr").inner_text().strip() == "something went sideways"
    screenshot(page, "log-stderr")

    with page.expect_download() as download_info:
        page.locator(".log-downloads").get_by_role("link", name="stdout").click()
    saved = tmp_path / "stdout.log"
    download_info.value.save_as(saved)
    job = Job.objects.get(pk=str(reply["id"]))
    assert saved.read_bytes() == Path(job.stdout_path).read_bytes()
    assert b"\rprogress 100%\n" in saved.read_bytes()


def test_a_running_job_is_cancelled_from_its_page(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
) -> None:
    script = "#!/bin/bash\necho 'waiting to be cancelled'\nsleep 300\n"
    reply = live_project.submit(name="long", script=script, partition="debug", gpu_type="", time_limit_minutes=10)
    live_project.wait_for(reply["id"], lambda job: job.state == JobState.RUNNING, timeout=120)
    page = open_page(live_project.member, viewport="tablet")
    page.goto(f"/jobs/{reply['id']}/")
    assert page.locator("#job-state").inner_text() == "Running"
    expect(page.locator("#terminal-stdout")).to_contain_text("waiting to be cancelled", timeout=LIVE_TIMEOUT_MS)
    page.get_by_text("Cancel this job…").click()
    screenshot(page, "cancel-confirm")
    page.get_by_role("button", name="Yes, cancel “long”").click()
    page.wait_for_url(f"**/jobs/{reply['id']}/")
    # The job is synced every second while it runs: by the time the page is back, Slurm may have cancelled it.
    requested = page.get_by_text("Cancel requested: a worker is cancelling the job in Slurm.")
    expect(requested.or_(page.locator("#job-state", has_text="Cancelled"))).to_be_visible()
    assert page.get_by_text("Cancel this job…").count() == 0
    expect(page.locator("#job-state")).to_have_text("Cancelled", timeout=LIVE_TIMEOUT_MS)
    assert page.locator("#timeline").get_by_text("Cancelled").count() >= 1
    screenshot(page, "cancelled")
    assert Job.objects.get(pk=str(reply["id"])).state == JobState.CANCELLED
