"""`GET /healthz`: the state of the database, Redis and each cluster's slurmrestd, as JSON."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from clusters.selectors import cluster_list_active


def _timed(check: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        detail = check() or {}
        return {"status": "ok", "latency_ms": round((time.perf_counter() - started) * 1000, 2), **detail}
    except Exception as exc:  # any failure of a dependency is what this endpoint reports
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"}


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _redis() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    finally:
        client.close()


def _clusters() -> list[dict[str, Any]]:
    """What the workers last recorded: the web tier never calls slurmrestd and never holds a cluster key."""
    stale_after = timedelta(seconds=settings.CLUSTER_HEALTH_STALE_SECONDS)
    now = timezone.now()
    report = []
    for cluster in cluster_list_active():
        if cluster.last_ping_at is None:
            status, error = "unknown", "no worker has checked this cluster yet; is the Celery worker running?"
        elif now - cluster.last_ping_at > stale_after:
            status = "stale"
            error = f"last checked {int((now - cluster.last_ping_at).total_seconds())}s ago; is Celery beat running?"
        elif cluster.last_ping_ok:
            status, error = "ok", ""
        else:
            status, error = "down", cluster.last_ping_error
        entry: dict[str, Any] = {
            "name": cluster.name,
            "status": status,
            "api_version": cluster.api_version or None,
            "slurm_release": cluster.slurm_release or None,
            "latency_ms": cluster.last_ping_latency_ms,
            "checked_at": cluster.last_ping_at.isoformat() if cluster.last_ping_at else None,
        }
        if error:
            entry["error"] = error
        report.append(entry)
    return report


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    database = _timed(_database)
    redis_state = _timed(_redis)
    clusters = _clusters() if database["status"] == "ok" else []
    healthy = (
        database["status"] == "ok"
        and redis_state["status"] == "ok"
        and all(cluster["status"] == "ok" for cluster in clusters)
    )
    body = {
        "status": "ok" if healthy else "degraded",
        "database": database,
        "redis": redis_state,
        "clusters": clusters,
    }
    return JsonResponse(body, status=200 if healthy else 503)
