"""`GET /healthz` reports the database, Redis and each cluster as the workers last saw it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters.models import Cluster

pytestmark = pytest.mark.django_db


def make_cluster(**fields: object) -> Cluster:
    return Cluster.objects.create(
        name=str(fields.pop("name", "local")),
        slurmrestd_url="http://127.0.0.1:6820",
        jwt_key_file="/etc/slurm/jwt_hs256.key",
        log_root="/srv/gpuportal/logs",
        **fields,
    )


def test_healthy_when_database_redis_and_every_cluster_answer(client: Client) -> None:
    make_cluster(
        api_version="0.0.38",
        slurm_release="22.05.8",
        last_ping_at=timezone.now(),
        last_ping_ok=True,
        last_ping_latency_ms=2.5,
    )

    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"]["status"] == "ok"
    assert body["redis"]["status"] == "ok"
    assert body["clusters"] == [
        {
            "name": "local",
            "status": "ok",
            "api_version": "0.0.38",
            "slurm_release": "22.05.8",
            "latency_ms": 2.5,
            "checked_at": body["clusters"][0]["checked_at"],
        }
    ]


def test_a_cluster_that_failed_its_last_check_makes_it_503_with_the_reason(client: Client) -> None:
    make_cluster(last_ping_at=timezone.now(), last_ping_ok=False, last_ping_error="slurmrestd is unreachable")

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["clusters"][0]["status"] == "down"
    assert response.json()["clusters"][0]["error"] == "slurmrestd is unreachable"


def test_a_cluster_no_worker_has_checked_is_unknown(client: Client) -> None:
    make_cluster()

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["clusters"][0]["status"] == "unknown"
    assert "Celery worker" in response.json()["clusters"][0]["error"]


def test_a_check_older_than_the_staleness_limit_is_stale(client: Client) -> None:
    make_cluster(last_ping_at=timezone.now() - timedelta(minutes=10), last_ping_ok=True)

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["clusters"][0]["status"] == "stale"


def test_redis_down_makes_it_503(client: Client, settings: object) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # type: ignore[attr-defined]

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["redis"]["status"] == "down"
    assert response.json()["database"]["status"] == "ok"


def test_inactive_clusters_are_not_reported(client: Client) -> None:
    make_cluster(is_active=False)

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json()["clusters"] == []
