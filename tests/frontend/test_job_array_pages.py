"""The submit form's Array field, the list's progress of an array and the job page's paginated task table."""

from __future__ import annotations

import json
import re

import pytest

from jobs.models import Job, JobArrayTask, JobState
from quotas.models import Allocation, LedgerEntry, LedgerKind
from tests.frontend.test_job_pages import Shop, _field_error, _form, shop  # noqa: F401 -- `shop` is a fixture

pytestmark = pytest.mark.django_db


def _log_socket(html: str) -> str:
    match = re.search(r'<script id="job-log" type="application/json">(.*?)</script>', html, re.S)
    assert match is not None
    socket: str = json.loads(match.group(1))["socket"]
    return socket


def test_an_array_from_the_form_shows_its_progress_in_the_list_and_its_tasks_page_by_page(shop: Shop) -> None:  # noqa: F811
    client = shop.client("member")
    response = client.post("/jobs/new/", _form(array="0-59%5", gpus="1", time_limit_minutes="10"))
    assert response.status_code == 302
    job = Job.objects.get()
    assert (job.array, job.array_task_count, job.array_max_running) == ("0-59%5", 60, 5)
    JobArrayTask.objects.filter(job=job, index__lt=3).update(state=JobState.COMPLETED, exit_code=0)
    JobArrayTask.objects.filter(job=job, index=3).update(state=JobState.FAILED, exit_code=2)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING,
        array_progress={"pending": 55, "running": 1, "completed": 3, "failed": 1, "cancelled": 0},
    )

    listing = client.get("/jobs/").content.decode()
    assert "3 done, 1 failed, 1 running, 55 pending" in listing

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>0-59%5</code>: 60 tasks (3 done, 1 failed, 1 running, 55 pending)" in page
    assert "Tasks page 1 of 2" in page
    rows = re.findall(r'<tr(?: aria-current="true")?>\s*<td class="number">(\d+)</td>', page)
    assert rows == [str(index) for index in range(50)]
    assert _log_socket(page) == f"/ws/jobs/{job.pk}/log/?task=0"
    assert f"/jobs/{job.pk}/output/stdout/?task=0" in page

    second = client.get(f"/jobs/{job.pk}/?tasks_page=2&task=55").content.decode()
    rows = re.findall(r'<tr(?: aria-current="true")?>\s*<td class="number">(\d+)</td>', second)
    assert rows == [str(index) for index in range(50, 60)]
    assert _log_socket(second) == f"/ws/jobs/{job.pk}/log/?task=55"
    assert "Output of task 55" in second


def test_a_bad_array_is_shown_beside_the_field_and_nothing_is_stored(shop: Shop) -> None:  # noqa: F811
    html = shop.client("member").post("/jobs/new/", _form(array="9-1")).content.decode()
    assert _field_error(html, "array") == "The range &#x27;9-1&#x27; ends before it starts; write it as 1-9."
    assert Job.objects.count() == 0


def test_an_array_cancelled_before_it_reached_slurm_ends_every_task_and_gives_every_reservation_back(
    shop: Shop,  # noqa: F811
) -> None:
    client = shop.client("member")
    client.post("/jobs/new/", _form(array="0-9", gpus="1", time_limit_minutes="6"))
    job = Job.objects.get()
    assert Allocation.objects.get(pk=shop.allocation.pk).reserved_gpu_seconds == 10 * 360

    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.array_progress == {"pending": 0, "running": 0, "completed": 0, "failed": 0, "cancelled": 10}
    assert set(JobArrayTask.objects.filter(job=job).values_list("state", flat=True)) == {"cancelled"}
    releases = LedgerEntry.objects.filter(job=job, kind=LedgerKind.RELEASE)
    assert sorted(index or 0 for index in releases.values_list("array_task", flat=True)) == list(range(10))
    assert Allocation.objects.get(pk=shop.allocation.pk).reserved_gpu_seconds == 0
