"""WebSocket consumers for jobs: one job, and the jobs of a project."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.exceptions import PermissionDenied
from django.http import Http404

from jobs.job_services import job_event, job_group, project_jobs_group
from jobs.models import ACTIVE_JOB_STATES
from jobs.selectors import job_get_for_user, job_list_for_user
from portal.ws_auth import websocket_refuse
from tenants.selectors import project_get_for_user
from tenants.services import user_access_group


class _JobWatchConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Pushes `{"type": "job.update", "job": {...}}` for each change of the watched jobs; to a job's watchers,
    also `{"type": "pipeline.update", "step": {id, state, updated_at}}` when a parent or child of it changes and
    `{"type": "job.tasks", "job": {id}}` when an array's tasks change while its own row does not.

    Authorisation happens in `connect` through the access helpers, and again whenever the user's
    memberships change (the membership services push `access.changed` to `user_access_group`): refused
    connections close with 4401 (not logged in), 4403 (role too low) or 4404 (nothing the user may see there),
    open ones with 4403 or 4404 as soon as that access is gone.
    """

    group: str = ""
    access_group: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await websocket_refuse(self, 4401)
            return
        try:
            self.group, snapshot = await database_sync_to_async(self.authorise)(user)
        except Http404:
            await websocket_refuse(self, 4404)
            return
        except PermissionDenied:
            await websocket_refuse(self, 4403)
            return
        self.access_group = user_access_group(user.pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        for job in snapshot:
            await self.send_json({"type": "job.update", "job": job})

    def authorise(self, user: Any) -> tuple[str, list[dict[str, Any]]]:
        raise NotImplementedError

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.access_group:
            await self.channel_layer.group_discard(self.access_group, self.channel_name)

    async def job_update(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "job.update", "job": event["job"]})

    async def pipeline_update(self, event: dict[str, Any]) -> None:
        # A parent or child of the watched job changed (the same project, so the viewer may see it).
        await self.send_json({"type": "pipeline.update", "step": event["step"]})

    async def job_tasks(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "job.tasks", "job": event["job"]})

    async def access_changed(self, event: dict[str, Any]) -> None:
        try:
            await database_sync_to_async(self.authorise)(self.scope["user"])
        except Http404:
            await self.close(code=4404)
        except PermissionDenied:
            await self.close(code=4403)


class ProjectJobsConsumer(_JobWatchConsumer):
    """`/ws/projects/{tenant}/{project}/jobs/`: the project's active jobs now, then every job change in it."""

    def authorise(self, user: Any) -> tuple[str, list[dict[str, Any]]]:
        kwargs = self.scope["url_route"]["kwargs"]
        project = project_get_for_user(user=user, tenant_slug=kwargs["tenant"], project_slug=kwargs["project"])
        active = job_list_for_user(user=user).filter(project=project, state__in=list(ACTIVE_JOB_STATES))
        return project_jobs_group(project.pk), [job_event(job) for job in active[:200]]


class JobConsumer(_JobWatchConsumer):
    """`/ws/jobs/{id}/`: the job's state now, then each change."""

    def authorise(self, user: Any) -> tuple[str, list[dict[str, Any]]]:
        job = job_get_for_user(user=user, job_id=self.scope["url_route"]["kwargs"]["job_id"])
        return job_group(job.pk), [job_event(job)]
