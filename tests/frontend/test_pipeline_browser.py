"""In a real browser: a pipeline step picked on the submit form, the job page's pipeline graph, and a parent's
cancel confirmation that says what becomes of the jobs waiting for it. No Slurm: the cluster is as a sync left it,
and the jobs wait in the portal's queue (a parent cancelled there ends at once)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from clusters.models import ClusterAccount
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_pipeline_step_is_picked_on_the_form_drawn_on_its_page_and_its_parents_cancel_says_what_follows(
    open_page: Any, screenshot: Any, tmp_path: Path, sent_tasks: list[SentTask]
) -> None:
    # `sent_tasks`: the jobs stay queued; a worker an earlier test left running would otherwise try to deliver them
    # to this cluster, which has no key, and reject the parent before the form names it.
    cluster = make_matrix_cluster("pipebrowser")
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    project = make_project(make_tenant(), "vision")
    grant_allocation(project, cluster, 100)
    member = make_user()
    add_project_member(project, member, "member")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    prepare, _ = job_submit(
        user=member,
        project=project,
        request=JobRequest(cluster="pipebrowser", name="prepare", script="#!/bin/bash\necho prepare\n"),
    )

    page = open_page(member)
    page.goto(f"/jobs/new/?project={project.tenant.slug}/{project.slug}&cluster=pipebrowser")
    page.get_by_label("Name").fill("train")
    page.locator(f"#depends_on_{prepare.pk}").check()
    page.get_by_label("Condition for prepare").select_option("afterok")
    screenshot(page, "pipeline-form")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    train = Job.objects.get(name="train")
    assert list(train.dependencies.values_list("parent__name", "condition")) == [("prepare", "afterok")]
    assert page.locator("svg.pipeline-graph").is_visible()
    assert page.locator("#pipeline-parents li").inner_text() == ("prepare (queued): runs after it succeeds (afterok)")
    screenshot(page, "pipeline-graph")

    # The child's page, open meanwhile, redraws its graph when its parent changes (no reload).
    watcher = open_page(member)
    watcher.goto(f"/jobs/{train.pk}/")
    watcher.wait_for_selector("#job-live-status[data-state='live']")

    page.goto(f"/jobs/{prepare.pk}/")
    page.get_by_text("Cancel this job…").click()
    assert (
        page.locator("#cancel-effects li").inner_text() == "“train” will never run: it waits for this job to succeed."
    )
    page.get_by_role("button", name="Yes, cancel “prepare”").click()
    page.wait_for_url(f"**/jobs/{prepare.pk}/")
    assert page.get_by_text(
        "The job was cancelled before it reached Slurm. “train” will never run: it waits for this job to succeed."
    ).is_visible()
    assert Job.objects.get(pk=prepare.pk).state == JobState.CANCELLED
    watcher.locator("#pipeline-parents li", has_text="prepare (cancelled)").wait_for(timeout=10_000)
    assert watcher.locator("#pipeline-parents li").inner_text() == (
        "prepare (cancelled): runs after it succeeds (afterok), can never be met"
    )
