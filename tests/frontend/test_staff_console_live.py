"""The admin console against the real clusters and a real Celery worker: a cluster registered in the console is
checked by the worker (version, reachable, partitions) on every Slurm generation, and a project created in the
console gets its Slurm account under its tenant's parent account, as a project created through the API does."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client

from clusters.models import Cluster, ProjectSlurmAccount
from clusters.slurm import SlurmClient
from tenants.models import AuditEvent, Project, Tenant
from tests.conftest import wait_until
from tests.factories import make_user, unique_slug
from tests.jobs.test_slurm_accounts import parent_of, slurm_accounts_to_remove  # noqa: F401  (a fixture)
from tests.live_clusters import LiveCluster

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def _staff_client() -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True))
    return client


def test_a_cluster_registered_in_the_console_is_checked_by_a_worker(celery_worker: str, live: LiveCluster) -> None:
    client = _staff_client()
    name = f"console-{live.name}"

    response = client.post(
        "/staff/clusters/",
        {
            "name": name,
            "slurmrestd_url": live.slurmrestd_url,
            "jwt_key_file": live.jwt_key_file,
            "admin_user": live.admin_user,
            "log_root": live.log_root,
        },
    )

    assert response.status_code == 302
    cluster = Cluster.objects.get(name=name)
    wait_until(lambda: Cluster.objects.get(pk=cluster.pk).inventory_synced_at is not None, what="the worker's check")
    cluster.refresh_from_db()
    assert (cluster.last_ping_ok, cluster.slurm_release) == (True, live.slurm_release)
    assert cluster.api_version
    html = client.get(response.headers["Location"]).content.decode()
    assert '<dd id="cluster-reachable"><span class="health-ok">Yes</span>' in html
    assert f"Slurm {live.slurm_release}; slurmrestd API {cluster.api_version}" in html
    assert f"{live.gpu_partition}" in html.split('id="cluster-partitions"')[1].split("</dd>")[0]
    assert AuditEvent.objects.filter(action="cluster.registered", target_label=name, actor_username="root").exists()

    # Checked again on request: the page waits until the worker has answered, then shows the new check.
    before = cluster.last_ping_at
    checked = client.post(f"/staff/clusters/{name}/check/")
    assert checked.status_code == 302
    assert "since=" in checked.headers["Location"]
    wait_until(lambda: Cluster.objects.get(pk=cluster.pk).last_ping_at != before, what="the second check")
    answered = client.get(checked.headers["Location"], headers={"HX-Request": "true"}).content.decode()
    assert "hx-trigger" not in answered
    assert '<span class="health-ok">Yes</span>' in answered


def test_a_project_created_in_the_console_gets_its_slurm_account(
    celery_worker: str,
    slurm_client: SlurmClient,
    slurm_accounts_to_remove: list[str],  # noqa: F811  (the fixture imported above)
) -> None:
    cluster = Cluster.objects.create(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
    )
    client = _staff_client()
    slug = unique_slug("con")

    assert client.post("/staff/tenants/", {"slug": slug, "name": "Console tenant"}).status_code == 302
    response = client.post(f"/staff/tenants/{slug}/projects/", {"slug": "vision", "name": "Vision"})
    assert response.status_code == 302
    tenant = Tenant.objects.get(slug=slug)
    project = Project.objects.get(tenant=tenant, slug="vision")
    slurm_accounts_to_remove.extend([project.slurm_account, tenant.slurm_parent_account])

    def ready() -> bool:
        return ProjectSlurmAccount.objects.filter(project=project, cluster=cluster, state="ready").exists()

    try:
        wait_until(ready, what="the worker's sync of the project created in the console")
        assert parent_of(slurm_client, tenant.slurm_parent_account) == "root"
        assert parent_of(slurm_client, project.slurm_account) == tenant.slurm_parent_account
        html: Any = client.get(response.headers["Location"]).content.decode()
        assert '<span class="badge badge-ready" id="account-state-local">Ready</span>' in html
    finally:
        # As in tests/jobs/test_slurm_accounts.py: a sync still queued does nothing once the project is gone.
        with transaction.atomic():
            ProjectSlurmAccount.objects.filter(project=project).delete()
            project.delete()
