"""In a real browser: bob (a member of acme/vision, whose GPU-hours on the 22.05 cluster are for h100 GPUs only,
as in the demo) opens Submit and the form starts from a shape his allocation covers, with a verdict that fits."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from clusters.models import ClusterAccount
from tests.factories import add_project_member, grant_allocation, make_project, make_tenant, make_user
from tests.jobs.conftest import local_cluster

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_bobs_form_starts_from_a_shape_his_allocation_covers(open_page: Any, screenshot: Any) -> None:
    cluster = local_cluster()
    project = make_project(make_tenant(), "vision")
    grant_allocation(project, cluster, 500, gpu_type="h100")
    bob = make_user()
    add_project_member(project, bob, "member")
    ClusterAccount.objects.create(cluster=cluster, user=bob, username="bob")

    page = open_page(bob)
    page.goto("/jobs/new/")
    assert page.get_by_label("Cluster").input_value() == "local"
    assert page.get_by_label("Partition").input_value() == "debug"
    assert page.get_by_label("GPU type").input_value() == "h100"
    estimate = page.locator("#estimate .estimate-message")
    expect(estimate).to_have_attribute("data-fits", "true")
    expect(estimate).to_contain_text("At most 0.17 GPU-hours on h100")
    expect(estimate).to_contain_text("leaves 499.83 of 500.00 GPU-hours")
    screenshot(page, "bob-submit-form")

    # Choosing "any type" by hand gets the submission's own refusal, with the fix.
    page.get_by_label("GPU type").select_option("")
    expect(estimate).to_have_attribute("data-fits", "false")
    expect(estimate).to_contain_text(
        "but it would be refused: vision's GPU-hours on cluster local are for h100 GPUs only; choose gpu_type "
        "h100, or a partition that has only those GPUs."
    )
