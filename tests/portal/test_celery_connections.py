"""A Celery worker's pool process keeps its PostgreSQL connection from task to task (portal/celery.py), where
Celery's default opens a new one for every task: with a real prefork worker on the test database."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from django.db import connection

from clusters.models import Cluster
from portal.celery import app as celery_app
from tests.conftest import wait_until
from tests.factories import make_matrix_cluster
from tests.processes import portal_environment

pytestmark = pytest.mark.django_db(transaction=True)


def database_ports(worker: subprocess.Popen[bytes]) -> set[int]:
    """The local ports of the pool processes' connections to PostgreSQL."""
    database_port = int(connection.settings_dict["PORT"])
    return {
        link.laddr.port
        for child in psutil.Process(worker.pid).children()
        for link in child.net_connections(kind="tcp")
        if link.raddr and link.raddr.port == database_port and link.status == psutil.CONN_ESTABLISHED
    }


def last_checked(cluster: Cluster) -> datetime | None:
    return Cluster.objects.get(pk=cluster.pk).last_ping_at


def idle(name: str) -> bool:
    answers = celery_app.control.inspect(destination=[name], timeout=1).active() or {}
    return answers.get(name) == []


def test_a_pool_process_keeps_its_database_connection_from_task_to_task(tmp_path: Path) -> None:
    cluster = make_matrix_cluster("keptconnection")  # unreachable: each sync records a failed check
    name, queue = f"pytest-prefork-{uuid.uuid4().hex[:8]}@localhost", f"kept-{uuid.uuid4().hex[:8]}"
    environment = portal_environment()
    command = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool=prefork", "--concurrency=1"]
    command += ["--hostname", name, "--queues", queue, "--without-mingle", "--without-gossip"]
    with (tmp_path / "worker.log").open("w") as output:
        worker = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: bool(celery_app.control.ping(destination=[name], timeout=0.5)), timeout_seconds=60)
        ports = []
        for _ in range(2):
            checked_before = Cluster.objects.get(pk=cluster.pk).last_ping_at
            celery_app.send_task("clusters.tasks.cluster_sync", (cluster.pk,), queue=queue)
            wait_until(lambda: last_checked(cluster) != checked_before, what="the sync")  # noqa: B023
            wait_until(lambda: idle(name), what="the worker's idleness")  # its task ended, after-task hooks too
            ports.append(database_ports(worker))
        assert len(ports[0]) == 1, ports
        assert ports[1] == ports[0]  # the second task ran on the first task's connection
    finally:
        worker.terminate()
        worker.wait(timeout=30)
