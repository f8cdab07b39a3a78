"""A multi-node job in a real browser on the real stack (uvicorn, Celery worker and beat, the local Slurm cluster):
the multi-node template on the form, its total in the estimate, and the job's page naming the nodes it ran on and
the one switch they hang under."""

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
TIMES = "\N{MULTIPLICATION SIGN}"


def test_a_two_node_job_from_the_template_runs_under_one_switch_and_its_page_names_nodes_and_switch(
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
    celery_beat: None,
    open_page: Any,
    screenshot: Any,
) -> None:
    local = next((cluster for cluster in live_clusters() if cluster.name == "local"), None)
    if local is None or not local.switches:
        pytest.skip("the local cluster was started before it described its network: run `make cluster`")
    page = open_page(live_project.member)
    page.goto("/jobs/new/")
    page.get_by_role("link", name="Multi-node training (PyTorch, torchrun)").click()
    page.wait_for_url("**template=pytorch-multi-node-training")
    page.get_by_label("Partition").select_option("h100")
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("GPUs per node").fill("1")
    expect(page.get_by_label("Nodes")).to_have_value("2")
    page.get_by_label("Switches at most (optional)").fill("1")
    page.get_by_label("Time limit (minutes)").fill("2")
    estimate = page.locator("#estimate-total")
    expect(estimate).to_have_text(f"2 GPUs in all: 2 nodes {TIMES} 1 GPU.", timeout=LIVE_TIMEOUT_MS)
    screenshot(page, "multi-node-form")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
    job = Job.objects.get(project=live_project.project, name="Multi-node training (PyTorch, torchrun)")
    assert (job.node_count, job.gpus, job.gpu_type, job.max_switches) == (2, 1, "h100", 1)

    job = live_project.wait_for(job.pk, lambda job: job.is_final, timeout=90)
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0), job.last_error
    page.reload()
    expect(page.locator("#job-nodes")).to_have_text("gpu[01-02]")  # h100's two nodes, both under leaf1
    expect(page.locator("#job-switches")).to_have_text("all under switch leaf1")
    expect(page.locator("#job-gpus")).to_have_text(f"2 in all: 2 nodes {TIMES} 1 {TIMES} h100")
    screenshot(page, "multi-node-job")
