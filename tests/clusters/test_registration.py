"""Registering a cluster: `manage.py cluster_add` checks it first and says what it found or what is wrong; a
slurmrestd that serves no API version the portal knows gets a clear health status instead of a crash."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from clusters.models import Cluster, GpuType, Partition
from clusters.services import cluster_check
from clusters.slurm import SlurmClient, SlurmNotFound
from tests.live_clusters import LiveCluster

pytestmark = pytest.mark.django_db


def _openapi_serving(*versions: str) -> httpx.MockTransport:
    paths: dict[str, object] = {
        f"/{plugin}/v{version}/ping/": {} for version in versions for plugin in ("slurm", "slurmdb")
    }
    return httpx.MockTransport(lambda request: httpx.Response(200, json={"openapi": "3.0.2", "paths": paths}))


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt.key"
    path.write_bytes(b"k" * 32)
    return path


def test_the_newest_version_both_sides_know_is_chosen(key_file: Path) -> None:
    client = SlurmClient(
        base_url="http://slurm.test", key_file=key_file, transport=_openapi_serving("0.0.41", "0.0.42")
    )

    assert client.served_versions() == ("0.0.42", "0.0.41")
    assert client.detect_version() == "0.0.42"


def test_a_slurmrestd_with_no_version_in_common_is_a_clear_health_error(key_file: Path) -> None:
    client = SlurmClient(
        base_url="http://slurm.test", key_file=key_file, transport=_openapi_serving("0.0.37", "0.0.39", "0.0.99")
    )
    with pytest.raises(SlurmNotFound) as raised:
        client.detect_version()
    assert "serves slurmrestd API versions 0.0.99, 0.0.39, 0.0.37, none of which the portal knows" in str(raised.value)

    cluster = Cluster.objects.create(
        name="future", slurmrestd_url="http://slurm.test", jwt_key_file=str(key_file), log_root="/srv/x"
    )
    Cluster.objects.filter(pk=cluster.pk).update(last_ping_ok=True, last_ping_at=timezone.now())

    assert cluster_check(cluster=cluster, client=client) is False

    cluster.refresh_from_db()
    assert cluster.last_ping_ok is False
    assert "none of which the portal knows" in cluster.last_ping_error


@pytest.mark.cluster
def test_cluster_add_checks_the_cluster_and_stores_what_it_found(live: LiveCluster) -> None:
    output = StringIO()

    call_command(
        "cluster_add",
        f"site-{live.name}",
        url=live.slurmrestd_url,
        key_file=live.jwt_key_file,
        log_root=live.log_root,
        stdout=output,
    )

    cluster = Cluster.objects.get(name=f"site-{live.name}")
    assert (cluster.slurm_release, cluster.last_ping_ok) == (live.slurm_release, True)
    assert cluster.api_version
    text = output.getvalue()
    assert f"Registered cluster 'site-{live.name}'" in text
    assert f"Slurm {live.slurm_release}" in text
    assert f"the portal uses {cluster.api_version}" in text
    total = GpuType.objects.get(cluster=cluster, name=live.gpu_type).gpus_total
    assert total == 2 * live.gpus_per_node
    assert f"{total}x {live.gpu_type}" in text
    assert set(Partition.objects.filter(cluster=cluster).values_list("name", flat=True)) >= {
        "debug",
        live.gpu_partition,
    }


def test_cluster_add_says_what_is_wrong_and_stores_nothing(tmp_path: Path, key_file: Path) -> None:
    with pytest.raises(CommandError) as unreachable:
        call_command("cluster_add", "nowhere", url="http://127.0.0.1:9", key_file=str(key_file), log_root="/srv/x")
    assert "could not be checked: slurmrestd at http://127.0.0.1:9 is unreachable" in str(unreachable.value)
    assert "Nothing was stored" in str(unreachable.value)

    with pytest.raises(CommandError) as no_key:
        call_command(
            "cluster_add", "nokey", url="http://127.0.0.1:9", key_file=str(tmp_path / "missing.key"), log_root="/x"
        )
    assert f"cannot read the cluster's JWT key file {tmp_path / 'missing.key'}" in str(no_key.value)
    assert not Cluster.objects.filter(name__in=["nowhere", "nokey"]).exists()

    call_command(
        "cluster_add", "later", url="http://127.0.0.1:9", key_file=str(key_file), log_root="/srv/x", no_check=True
    )
    assert Cluster.objects.get(name="later").api_version == ""
