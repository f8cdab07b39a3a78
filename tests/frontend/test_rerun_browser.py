"""In a real browser: "Run again" and "Edit and run again" from a finished job's page, and the link between the
runs on both pages. No Slurm: the cluster is as a sync left it, and the new jobs wait in the portal's queue."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from clusters.models import ClusterAccount
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_finished_job_runs_again_as_it_was_and_edited(open_page: Any, screenshot: Any, tmp_path: Path) -> None:
    cluster = make_matrix_cluster("browsercluster")
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    project = make_project(make_tenant(), "vision")
    grant_allocation(project, cluster, 100)
    member = make_user()
    add_project_member(project, member, "member")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    job, _ = job_submit(
        user=member,
        project=project,
        request=JobRequest(cluster="browsercluster", name="train", gpus=2, script="#!/bin/bash\necho train\n"),
    )
    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED, exit_code=0, ended_at=timezone.now())

    page = open_page(member)
    page.goto(f"/jobs/{job.pk}/")
    page.get_by_role("button", name="Run again").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    again = Job.objects.get(rerun_of=job, name="train")
    assert page.url.endswith(f"/jobs/{again.pk}/")
    assert page.get_by_text("“train” runs again as this job").is_visible()
    assert page.locator("#rerun-of a").inner_text() == "train"
    screenshot(page, "rerun")

    page.goto(f"/jobs/{job.pk}/")
    assert page.locator("#reruns a").inner_text() == "train"
    page.get_by_role("link", name="Edit and run again").click()
    page.wait_for_url(f"**/jobs/new/?rerun={job.pk}")
    assert page.get_by_label("GPUs").input_value() == "2"
    page.get_by_label("Name").fill("train, one GPU")
    page.get_by_label("GPUs").fill("1")
    screenshot(page, "edit-and-rerun")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    edited = Job.objects.get(rerun_of=job, name="train, one GPU")
    assert (edited.gpus, edited.script, edited.user) == (1, "#!/bin/bash\necho train\n", member)
    assert page.locator("#rerun-of a").inner_text() == "train"
