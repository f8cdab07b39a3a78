"""The submit form in a real browser on the real stack (uvicorn, Celery worker and beat, the local Slurm
cluster), with the keyboard alone: CPUs and memory typed into the form reach Slurm's job record, and a bad
value is named beside its field before anything is sent."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from jobs.models import Job, JobState
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)
from tests.live_clusters import live_clusters

pytestmark = [pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT_MS = 120_000
# More Tab presses than the page has stops: a field not reached within them is not reachable by keyboard.
MOST_TAB_STOPS = 80


def _tab_to(page: Any, element_id: str) -> None:
    """Press Tab until the element has the focus, as a keyboard user moves through the page."""
    for _ in range(MOST_TAB_STOPS):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement && document.activeElement.id") == element_id:
            return
    pytest.fail(f"#{element_id} was not reached with Tab")


def _replace(page: Any, element_id: str, text: str) -> None:
    _tab_to(page, element_id)
    page.keyboard.press("Control+A")
    page.keyboard.type(text)


def test_a_job_is_submitted_with_the_keyboard_alone_and_slurm_gets_its_cpus_and_memory(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
) -> None:
    local = next(cluster for cluster in live_clusters() if cluster.name == "local")
    page = open_page(live_project.member)
    page.goto("/jobs/new/")
    page.locator("#estimate .estimate-message").wait_for()

    # The local cluster's nodes have 16 CPUs and 31 GB: 17 CPUs are refused beside the field, with the limit.
    _replace(page, "id_cpus", "17")
    _replace(page, "id_memory_gb", "8")
    _replace(page, "id_time_limit_minutes", "2")
    _replace(page, "id_name", "keyboard sized")
    _tab_to(page, "submit-job")
    page.keyboard.press("Enter")
    error = page.locator("#error-cpus")
    expect(error).to_contain_text("have at most 16 CPUs; ask for 16 or fewer per node")
    expect(page.locator("#id_cpus")).to_have_attribute("aria-invalid", "true")
    assert "error-cpus" in (page.locator("#id_cpus").get_attribute("aria-describedby") or "")
    assert Job.objects.filter(project=live_project.project).count() == 0
    screenshot(page, "cpus-refused")

    _replace(page, "id_cpus", "4")
    _tab_to(page, "submit-job")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
    job = Job.objects.get(project=live_project.project)
    assert (job.name, job.cpus, job.memory_gb) == ("keyboard sized", 4, 8)

    job = live_project.wait_for(job.pk, lambda job: job.slurm_job_id is not None, timeout=60)
    record = local.slurm_command("scontrol", "show", "job", str(job.slurm_job_id))
    assert re.search(r"\bNumCPUs=4\b", record), record
    assert re.search(r"\bMinMemoryNode=8G\b", record), record
    job = live_project.wait_for(job.pk, lambda job: job.is_final, timeout=90)
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0), job.last_error
    screenshot(page, "submitted")
