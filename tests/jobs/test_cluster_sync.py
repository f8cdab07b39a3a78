"""Syncing a registered cluster's health and inventory from the real local cluster, and pushing it to watchers."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from clusters.consumers import ClusterStatusConsumer
from clusters.models import Cluster, GpuType, Node, Partition
from clusters.tasks import cluster_sync
from tests.websockets import handshake

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def local_cluster() -> Cluster:
    return Cluster.objects.create(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
    )


def test_sync_records_version_health_partitions_gpu_types_and_nodes(local_cluster: Cluster) -> None:
    cluster_sync(local_cluster.pk)

    local_cluster.refresh_from_db()
    assert local_cluster.api_version == "0.0.38"
    assert local_cluster.slurm_release.startswith("22.05.")
    assert local_cluster.last_ping_ok is True
    assert local_cluster.last_ping_error == ""
    assert local_cluster.last_ping_latency_ms is not None
    assert local_cluster.inventory_synced_at is not None

    partitions = {p.name: p for p in Partition.objects.filter(cluster=local_cluster)}
    assert set(partitions) == {"debug", "h100", "a100"}
    assert partitions["debug"].max_time_minutes == 30
    assert partitions["debug"].is_default is True
    assert partitions["debug"].node_names == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert partitions["debug"].gpu_types == ["a100", "h100"]
    assert (partitions["h100"].node_names, partitions["h100"].gpu_types) == (["gpu01", "gpu02"], ["h100"])
    assert (partitions["h100"].max_gpus_per_node, partitions["a100"].max_gpus_per_node) == (4, 8)

    gpu_types = {g.name: (g.gpus_total, g.max_gpus_per_node) for g in GpuType.objects.filter(cluster=local_cluster)}
    assert gpu_types == {"h100": (8, 4), "a100": (16, 8)}

    nodes = {n.name: n for n in Node.objects.filter(cluster=local_cluster)}
    assert set(nodes) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert {name: (n.gpu_type, n.gpus_total) for name, n in nodes.items()} == {
        "gpu01": ("h100", 4),
        "gpu02": ("h100", 4),
        "gpu03": ("a100", 8),
        "gpu04": ("a100", 8),
    }
    assert all(n.state in {"idle", "mixed", "allocated"} for n in nodes.values())


def test_sync_of_an_unreachable_cluster_records_the_error_and_keeps_the_inventory(local_cluster: Cluster) -> None:
    cluster_sync(local_cluster.pk)
    Cluster.objects.filter(pk=local_cluster.pk).update(slurmrestd_url="http://127.0.0.1:9")  # discard port

    cluster_sync(local_cluster.pk)

    local_cluster.refresh_from_db()
    assert local_cluster.last_ping_ok is False
    assert "unreachable" in local_cluster.last_ping_error
    assert Node.objects.filter(cluster=local_cluster).count() == 4


def test_watchers_get_the_current_status_then_each_sync() -> None:
    user = get_user_model().objects.create_user(username="watcher")
    cluster = Cluster.objects.create(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
    )

    async def watch() -> tuple[dict[str, object], dict[str, object]]:
        communicator = WebsocketCommunicator(ClusterStatusConsumer.as_asgi(), "/ws/clusters/")
        communicator.scope["user"] = user
        connected, _ = await handshake(communicator)
        assert connected
        first = await communicator.receive_json_from(timeout=5)
        from asgiref.sync import sync_to_async

        await sync_to_async(cluster_sync)(cluster.pk)
        pushed = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return first, pushed

    first, pushed = async_to_sync(watch)()

    assert first["type"] == "cluster.status"
    assert first["cluster"]["name"] == "local"  # type: ignore[index]
    assert first["cluster"]["nodes"] == []  # type: ignore[index]
    assert pushed["cluster"]["ok"] is True  # type: ignore[index]
    assert [n["name"] for n in pushed["cluster"]["nodes"]] == ["gpu01", "gpu02", "gpu03", "gpu04"]  # type: ignore[index]


def test_anonymous_watchers_are_refused() -> None:
    async def connect() -> bool:
        communicator = WebsocketCommunicator(ClusterStatusConsumer.as_asgi(), "/ws/clusters/")
        communicator.scope["user"] = AnonymousUser()
        connected, _ = await handshake(communicator)
        await communicator.disconnect()
        return bool(connected)

    assert async_to_sync(connect)() is False


def _session_cookie_for(user: object) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return f"sessionid={client.cookies['sessionid'].value}"


def test_the_asgi_application_routes_websockets_with_session_auth_and_same_origin_only() -> None:
    from portal.asgi import application

    user = get_user_model().objects.create_user(username="browser")
    cookie = _session_cookie_for(user)

    async def connect(origin: bytes, with_cookie: bool) -> bool:
        headers = [(b"origin", origin), (b"host", b"127.0.0.1:8000")]
        if with_cookie:
            headers.append((b"cookie", cookie.encode()))
        communicator = WebsocketCommunicator(application, "/ws/clusters/", headers=headers)
        connected, _ = await handshake(communicator)
        await communicator.disconnect()
        return bool(connected)

    assert async_to_sync(connect)(b"http://127.0.0.1:8000", True) is True
    assert async_to_sync(connect)(b"http://127.0.0.1:8000", False) is False
    assert async_to_sync(connect)(b"https://evil.example", True) is False


def test_a_real_worker_runs_the_fan_out_and_the_sync_through_the_broker(
    celery_worker: str, local_cluster: Cluster
) -> None:
    from clusters.tasks import cluster_sync_all
    from tests.conftest import wait_until

    cluster_sync_all.delay()  # what beat sends every CLUSTER_SYNC_INTERVAL_SECONDS

    wait_until(
        lambda: Cluster.objects.get(pk=local_cluster.pk).inventory_synced_at is not None,
        what="the worker's sync of the local cluster",
    )
    assert Cluster.objects.get(pk=local_cluster.pk).api_version == "0.0.38"
    assert Node.objects.filter(cluster=local_cluster).count() == 4
