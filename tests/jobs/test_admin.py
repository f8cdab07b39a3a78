"""The Django admin pages portal admins use for clusters and tenants render with their synced data."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster, ClusterAccount, GpuType, Node, Partition
from jobs.job_services import JobRequest, job_submit
from jobs.models import Job, JobState, ProjectEfficiencyPolicy
from tenants.models import Project, Tenant
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_logged_in(client: Client) -> Client:
    admin = get_user_model().objects.create_superuser(username="root-admin", password="x")
    client.force_login(admin)
    return client


@pytest.fixture
def synced_cluster() -> Cluster:
    now = timezone.now()
    cluster = Cluster.objects.create(
        name="local",
        slurmrestd_url="http://127.0.0.1:6820",
        jwt_key_file="/etc/slurm/jwt_hs256.key",
        log_root="/srv/gpuportal/logs",
        api_version="0.0.38",
        last_ping_ok=True,
        last_ping_at=now,
    )
    GpuType.objects.create(cluster=cluster, name="h100", gpus_total=8, gpus_used=1, max_gpus_per_node=4, synced_at=now)
    Partition.objects.create(cluster=cluster, name="h100", state="UP", node_names=["gpu01"], synced_at=now)
    Node.objects.create(cluster=cluster, name="gpu01", state="mixed", gpu_type="h100", gpus_total=4, synced_at=now)
    return cluster


def test_the_cluster_page_shows_registration_and_synced_inventory(
    admin_client_logged_in: Client, synced_cluster: Cluster
) -> None:
    response = admin_client_logged_in.get(f"/admin/clusters/cluster/{synced_cluster.pk}/change/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "http://127.0.0.1:6820" in page
    assert "gpu01" in page
    assert "Last seen by the workers" in page


def test_the_sync_now_action_schedules_a_sync_after_commit(
    admin_client_logged_in: Client, synced_cluster: Cluster, django_capture_on_commit_callbacks: object
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:  # type: ignore[operator]
        response = admin_client_logged_in.post(
            "/admin/clusters/cluster/",
            {"action": "sync_now", "_selected_action": [synced_cluster.pk]},
            follow=True,
        )

    assert response.status_code == 200
    assert "Asked the workers to sync 1 cluster(s)." in response.content.decode()
    assert len(callbacks) == 1


def test_tenant_and_project_pages_render(admin_client_logged_in: Client) -> None:
    tenant = Tenant.objects.create(slug="acme", name="ACME")
    project = Project.objects.create(tenant=tenant, slug="vision", name="Vision")

    assert admin_client_logged_in.get(f"/admin/tenants/tenant/{tenant.pk}/change/").status_code == 200
    assert admin_client_logged_in.get(f"/admin/tenants/project/{project.pk}/change/").status_code == 200
    assert admin_client_logged_in.get("/admin/clusters/clusteraccount/add/").status_code == 200


@pytest.mark.django_db
def test_a_cluster_username_that_is_not_a_posix_name_is_refused_in_the_admin(
    admin_client_logged_in: Client, synced_cluster: Cluster
) -> None:
    from clusters.models import ClusterAccount

    user = get_user_model().objects.create_user(username="dora")
    form = {"cluster": synced_cluster.pk, "user": user.pk, "username": "dora; rm -rf /"}
    response = admin_client_logged_in.post("/admin/clusters/clusteraccount/add/", form)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "username": ["A POSIX user name: lower-case letters, digits, '_' and '-', starting with a letter or '_'."]
    }
    assert not ClusterAccount.objects.filter(user=user).exists()
    form["username"] = "dora"
    assert admin_client_logged_in.post("/admin/clusters/clusteraccount/add/", form).status_code == 302
    assert ClusterAccount.objects.get(user=user).username == "dora"


@pytest.mark.django_db
def test_a_portal_admin_cancels_a_queued_job_from_the_admin() -> None:
    cluster = make_matrix_cluster()
    member = make_user()
    project = make_project(make_tenant())
    add_project_member(project, member)
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    grant_allocation(project, cluster)
    job, _ = job_submit(user=member, project=project, request=JobRequest(cluster=cluster.name, script="#!/bin/sh\n"))
    admin_client = Client()
    admin_client.force_login(make_user(is_staff=True))

    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/")
    response = admin_client.post(
        "/admin/jobs/job/", {"action": "cancel_jobs", "_selected_action": [str(job.pk)]}, follow=True
    )

    assert page.status_code == 200
    assert response.status_code == 200
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert "Cancelling 1 job(s)." in response.content.decode()


def test_an_idle_gpu_policy_is_changed_only_where_it_is_checked_and_audited(admin_client_logged_in: Client) -> None:
    """The admin shows a project's idle-GPU policy but does not edit it: a change there would skip the bounds and
    the audit event that the project page and the API apply."""
    project = make_project(make_tenant("acme"), "vision")
    policy = ProjectEfficiencyPolicy.objects.create(project=project, end_idle_jobs=True)

    assert admin_client_logged_in.get("/admin/jobs/projectefficiencypolicy/").status_code == 200
    change = admin_client_logged_in.post(
        f"/admin/jobs/projectefficiencypolicy/{policy.pk}/change/", {"project": project.pk, "end_idle_jobs": ""}
    )
    assert change.status_code == 403
    assert admin_client_logged_in.get("/admin/jobs/projectefficiencypolicy/add/").status_code == 403
    policy.refresh_from_db()
    assert policy.end_idle_jobs is True
