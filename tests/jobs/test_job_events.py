"""Job changes pushed over Channels (real Redis) to the watchers of a project and of a job."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from clusters.models import ClusterAccount
from jobs.job_services import job_cancel, jobs_push, jobs_tasks_push
from jobs.models import Job, JobDependency
from tenants.services import token_create
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user
from tests.websockets import handshake

pytestmark = pytest.mark.django_db(transaction=True)

HEADERS = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]


def _cookie(user: Any) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def _watch(path: str, header: tuple[bytes, bytes]) -> WebsocketCommunicator:
    from portal.asgi import application

    communicator = WebsocketCommunicator(application, path, headers=[*HEADERS, header])
    connected, _ = await handshake(communicator, timeout=5)
    assert connected, path
    return communicator


def _queued_job(user: Any, project: Any, cluster: Any) -> Job:
    """A queued job stored without a delivery task: a Celery worker running for other tests must not take it."""
    return Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username="alice",
        name="watched",
        partition="gpu",
        gpus=1,
        time_limit_minutes=5,
        script="#!/bin/sh\n",
    )


def test_watchers_of_the_job_and_of_its_project_see_each_change() -> None:
    cluster = make_matrix_cluster()
    member = make_user()
    project = make_project(make_tenant())
    add_project_member(project, member)
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    job = _queued_job(member, project, cluster)
    _, secret = token_create(user=member, name="watcher")
    cookie = _cookie(member)

    async def scenario() -> None:
        job_socket = await _watch(f"/ws/jobs/{job.pk}/", (b"authorization", f"Bearer {secret}".encode()))
        project_socket = await _watch(f"/ws/projects/{project.tenant.slug}/{project.slug}/jobs/", cookie)
        # Each first receives the current state.
        for socket in (job_socket, project_socket):
            snapshot = await socket.receive_json_from(timeout=5)
            assert (snapshot["type"], snapshot["job"]["id"], snapshot["job"]["state"]) == (
                "job.update",
                str(job.pk),
                "queued",
            )

        await sync_to_async(job_cancel)(user=member, job=job)

        for socket in (job_socket, project_socket):
            update = await socket.receive_json_from(timeout=5)
            assert update["job"]["id"] == str(job.pk)
            assert update["job"]["state"] == "cancelled"
            assert update["job"]["project"] == f"{project.tenant.slug}/{project.slug}"
            assert "script" not in update["job"]
            await socket.disconnect()

    async_to_sync(scenario)()


def test_an_outsider_cannot_watch_another_tenants_job() -> None:
    cluster = make_matrix_cluster()
    member, outsider = make_user(), make_user()
    project = make_project(make_tenant())
    add_project_member(project, member)
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    job = _queued_job(member, project, cluster)
    cookie = _cookie(outsider)

    async def refused(path: str) -> tuple[bool, int | None]:
        from portal.asgi import application

        communicator = WebsocketCommunicator(application, path, headers=[*HEADERS, cookie])
        connected, code = await handshake(communicator, timeout=5)
        # Let the application finish before the loop closes, as for an accepted socket.
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(refused)(f"/ws/jobs/{job.pk}/") == (False, 4404)
    assert async_to_sync(refused)(f"/ws/projects/{project.tenant.slug}/{project.slug}/jobs/") == (False, 4404)


def test_a_steps_page_hears_of_its_parents_and_children_and_an_arrays_of_its_tasks() -> None:
    """The job page's socket carries what redraws its pipeline graph and task table: a neighbour's id and state
    (`pipeline.update`) and an array's id (`job.tasks`); a job outside the pipeline is not heard of."""
    cluster = make_matrix_cluster()
    member, viewer = make_user(), make_user()
    project = make_project(make_tenant())
    add_project_member(project, member)
    add_project_member(project, viewer, "viewer")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    parent, child, other = (_queued_job(member, project, cluster) for _ in range(3))
    JobDependency.objects.create(child=child, parent=parent, condition="afterok")
    cookie = _cookie(viewer)

    async def scenario() -> None:
        child_socket = await _watch(f"/ws/jobs/{child.pk}/", cookie)
        parent_socket = await _watch(f"/ws/jobs/{parent.pk}/", cookie)
        for socket in (child_socket, parent_socket):
            assert (await socket.receive_json_from(timeout=5))["type"] == "job.update"  # the snapshot

        await sync_to_async(jobs_push)([other.pk])  # not a step of this pipeline
        await sync_to_async(job_cancel)(user=member, job=parent)
        update = await child_socket.receive_json_from(timeout=5)
        assert update["type"] == "pipeline.update"
        assert {key: update["step"][key] for key in ("id", "state")} == {"id": str(parent.pk), "state": "cancelled"}
        assert (await parent_socket.receive_json_from(timeout=5))["type"] == "job.update"  # its own change

        await sync_to_async(jobs_tasks_push)([parent.pk])
        assert await parent_socket.receive_json_from(timeout=5) == {"type": "job.tasks", "job": {"id": str(parent.pk)}}
        assert await child_socket.receive_nothing(timeout=0.2)
        for socket in (child_socket, parent_socket):
            await socket.disconnect()

    async_to_sync(scenario)()
