"""Fixtures for job tests: a project with a real Slurm account on the local cluster and a member to submit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from rest_framework.test import APIClient

from clusters.accounts import project_slurm_sync
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ClusterAccount
from clusters.services import cluster_check, cluster_sync_inventory
from clusters.slurm import SlurmClient, SlurmError, SlurmNotFound
from jobs.job_sync import SyncResult, cluster_jobs_sync
from jobs.models import Job
from tenants.models import Project
from tests.conftest import celery_workers_idle
from tests.factories import add_project_member, grant_allocation, make_project, make_tenant, make_user
from tests.live_clusters import LiveCluster


def local_cluster() -> Cluster:
    """The local cluster registered and its inventory synced, as the workers would have left it."""
    return _registered(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
        admin_user=settings.LOCAL_CLUSTER_ADMIN_USER,
    )


def registered_cluster(live: LiveCluster) -> Cluster:
    """A live cluster of any generation registered in the portal and its inventory synced."""
    return _registered(
        name=live.name,
        slurmrestd_url=live.slurmrestd_url,
        jwt_key_file=live.jwt_key_file,
        log_root=live.log_root,
        admin_user=live.admin_user,
    )


def _registered(*, name: str, **connection: str) -> Cluster:
    cluster, _ = Cluster.objects.get_or_create(name=name, defaults=connection)
    client = slurm_client_for(cluster)
    assert cluster_check(cluster=cluster, client=client), cluster.last_ping_error
    cluster_sync_inventory(cluster=cluster, client=client)
    return cluster


@dataclass
class LiveProject:
    cluster: Cluster
    project: Project
    member: User  # runs as the POSIX user alice
    manager: User  # runs as bob
    api: APIClient  # logged in as `member`
    partition: str = "h100"
    gpu_type: str = "h100"

    @property
    def label(self) -> str:
        return f"{self.project.tenant.slug}/{self.project.slug}"

    def client_for(self, user: User) -> APIClient:
        api = APIClient()
        api.force_authenticate(user)
        return api

    def submit(self, **fields: object) -> dict[str, object]:
        body = {
            "project": self.label,
            "cluster": self.cluster.name,
            "partition": self.partition,
            "gpus": 1,
            "gpu_type": self.gpu_type,
            "time_limit_minutes": 2,
            "script": "#!/bin/bash\necho hello\n",
            **fields,
        }
        response = self.api.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 202, response.json()
        data: dict[str, object] = response.json()
        return data

    def sync(self) -> SyncResult:
        cluster = Cluster.objects.get(pk=self.cluster.pk)
        return cluster_jobs_sync(cluster=cluster, client=slurm_client_for(cluster))

    def wait_for(self, job_id: object, condition: Callable[[Job], bool], *, timeout: float = 60) -> Job:
        """Sync from Slurm (as beat would) until the job satisfies `condition`."""
        deadline = time.monotonic() + timeout
        while True:
            job = Job.objects.get(pk=str(job_id))
            if condition(job):
                return job
            if time.monotonic() > deadline:
                why = job.state_reason or job.last_error
                pytest.fail(f"job {job_id} is still {job.state} ({why}) after {timeout}s")
            time.sleep(0.3)
            self.sync()


@pytest.fixture
def live_project(slurm_client: SlurmClient) -> Iterator[LiveProject]:
    """A tenant and project with its Slurm account; alice as member, bob as manager. Cleaned up in Slurm after."""
    yield from _live_project(local_cluster(), slurm_client)


@pytest.fixture
def contract_project(live: LiveCluster) -> Iterator[LiveProject]:
    """`live_project` on each live cluster in turn (Slurm 22.05, 24.11, 26.05)."""
    cluster = registered_cluster(live)
    yield from _live_project(cluster, slurm_client_for(cluster), partition=live.gpu_partition, gpu_type=live.gpu_type)


def _live_project(
    cluster: Cluster,
    slurm_client: SlurmClient,
    *,
    partition: str = "h100",
    gpu_type: str = "h100",
    with_allocation: bool = True,
) -> Iterator[LiveProject]:
    # One transaction, so the tasks its services queue (the project's Slurm sync, the limit sync) reach the
    # session's worker only once everything exists; they are dropped then, and the fixture syncs the project
    # itself. A worker syncing the project while the fixture was still writing it deadlocked on the cluster's
    # row once in CI.
    with transaction.atomic():
        member, manager = make_user(), make_user()
        ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
        ClusterAccount.objects.create(cluster=cluster, user=manager, username="bob")
        tenant = make_tenant()
        project = make_project(tenant)
        add_project_member(project, member, "member")
        add_project_member(project, manager, "manager")
        if with_allocation:
            grant_allocation(project, cluster)
    celery_workers_idle()
    project_slurm_sync(project_id=project.pk)
    api = APIClient()
    api.force_authenticate(member)
    yield LiveProject(
        cluster=cluster,
        project=project,
        member=member,
        manager=manager,
        api=api,
        partition=partition,
        gpu_type=gpu_type,
    )
    _remove_from_slurm(
        slurm_client, account=project.slurm_account, parent=tenant.slurm_parent_account, cluster=cluster.name
    )


def _remove_from_slurm(client: SlurmClient, *, account: str, parent: str, cluster: str = "local") -> None:
    # Not while the session's worker may still be syncing this project: a parent account deleted under a sync
    # that is adding associations to it leaves slurmdbd's association tree broken for every later test.
    celery_workers_idle()
    listing = client.list_jobs()
    for job in listing.jobs if listing else ():
        if job.account == account and not job.state.is_finished:
            try:
                client.cancel_job(user=client.admin_user, job_id=job.job_id)
            except SlurmNotFound:  # an array's task that ended or was cancelled since the listing
                continue
    for name in (account, parent):
        for _ in range(40):  # slurmdbd refuses while a cancelled job is still completing
            try:
                for user in ("alice", "bob"):
                    _remove_association(client, account=name, user=user, cluster=cluster)
                client.delete_account(name=name)
                break
            except SlurmError as exc:
                if any(message.error_number == 1900 for message in exc.messages):
                    break
                time.sleep(0.5)
        else:
            # Deleting the parent would take the account's associations with it while Slurm still holds jobs
            # in it, which leaves slurmctld's association tree broken: leave both for a later cleanup.
            return


def _remove_association(client: SlurmClient, *, account: str, user: str, cluster: str) -> None:
    try:
        client.remove_user_association(account=account, user=user, cluster=cluster)
    except SlurmError as exc:
        if not any(message.error_number in (1900, 9003) for message in exc.messages) and exc.status_code != 404:
            raise
