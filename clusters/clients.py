"""Slurm clients for registered clusters. Import only from Celery tasks: building one reads the cluster's key."""

from __future__ import annotations

import threading

from django.conf import settings

from clusters.models import Cluster
from clusters.slurm import SlurmClient
from portal.metrics import SlurmrestdMetrics

_clients: dict[tuple[int, str, str, str, str], SlurmClient] = {}
_lock = threading.Lock()


def slurm_client_for(cluster: Cluster) -> SlurmClient:
    """A pooled client per cluster and configuration, reused across tasks in one worker process."""
    key = (cluster.pk, cluster.slurmrestd_url, cluster.jwt_key_file, cluster.admin_user, cluster.api_version)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = SlurmClient(
                base_url=cluster.slurmrestd_url,
                key_file=cluster.jwt_key_file,
                admin_user=cluster.admin_user,
                api_version=cluster.api_version or None,
                timeout_seconds=settings.SLURM_HTTP_TIMEOUT_SECONDS,
                max_connections=settings.SLURM_HTTP_MAX_CONNECTIONS,
                token_lifespan_seconds=settings.SLURM_TOKEN_LIFESPAN_SECONDS,
                observer=SlurmrestdMetrics(cluster.name),
            )
            _clients[key] = client
        return client


def slurm_clients_close() -> None:
    """Close every pooled client and its keep-alive connections; the next `slurm_client_for` makes new ones.

    For a process that is done with the clusters it knew: the test suite after each test, whose clusters are
    new rows every time and would otherwise each keep their connections open (over a hundred held at once
    against the 22.05 slurmrestd, which twice stopped answering altogether under them).
    """
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
