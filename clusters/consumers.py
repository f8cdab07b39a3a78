"""WebSocket consumer for cluster status."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from clusters.selectors import cluster_list_active, cluster_status
from portal.ws_auth import websocket_refuse

CLUSTER_STATUS_GROUP = "cluster-status"


class ClusterStatusConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """`/ws/clusters/`: the current status of every cluster, then each update the workers push.

    Cluster status holds no tenant data, so any logged-in user may watch it.
    """

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await websocket_refuse(self, 4401)
            return
        await self.channel_layer.group_add(CLUSTER_STATUS_GROUP, self.channel_name)
        await self.accept()
        for status in await self._current():
            await self.send_json({"type": "cluster.status", "cluster": status})

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(CLUSTER_STATUS_GROUP, self.channel_name)

    async def cluster_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "cluster.status", "cluster": event["cluster"]})

    async def _current(self) -> list[dict[str, object]]:
        statuses: list[dict[str, object]] = await database_sync_to_async(_current_statuses)()
        return statuses


def _current_statuses() -> list[dict[str, object]]:
    return [cluster_status(cluster=cluster) for cluster in cluster_list_active()]
