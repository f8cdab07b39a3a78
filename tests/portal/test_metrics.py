"""`GET /metrics`: who may read it, and that what the portal does shows in it exactly (README, "Metrics and alerts").

These scrape in this process; tests/jobs/test_job_metrics.py scrapes the real servers, with a real Celery worker.
Every scrape sums the metric files of the whole test run (multiprocess mode, tests/settings.py), so the tests
compare two scrapes: the difference is what the test did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import ReconciliationReport, ReconciliationState
from clusters.models import Cluster, ClusterAccount, SlurmDriftReport
from jobs.models import Job, JobState
from portal.env import ConfigurationError, env_networks
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)
from tests.metrics import Samples, delta, parse, value
from tests.websockets import handshake

SCRIPT = "#!/bin/bash\necho hi\n"


def scrape(**extra: Any) -> Samples:
    response = Client().get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


# Who may read it ------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_scraper_on_loopback_reads_the_metrics() -> None:
    samples = scrape()
    assert value(samples, "portal_metrics_state_ok") == 1


@pytest.mark.django_db
def test_an_address_outside_the_allow_list_is_refused_whatever_it_claims_to_forward() -> None:
    response = Client().get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="127.0.0.1")

    assert response.status_code == 403
    assert response.json() == {
        "code": "permission_denied",
        "message": "The metrics may not be read from 203.0.113.9: scrape from an address in PORTAL_METRICS_ALLOW.",
        "fields": {},
    }


@pytest.mark.django_db
@override_settings(PORTAL_METRICS_ALLOW=env_networks("X", ["10.0.0.0/8"]))
def test_the_allow_list_takes_networks() -> None:
    assert Client().get("/metrics", REMOTE_ADDR="10.20.30.40").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


@pytest.mark.django_db
def test_behind_the_proxy_the_address_is_the_one_the_proxy_saw() -> None:
    """nginx appends the address it saw to X-Forwarded-For; only that last entry counts (PORTAL_NUM_PROXIES=1)."""
    from django.conf import settings

    proxied = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    with override_settings(REST_FRAMEWORK=proxied):
        # Through a Unix socket the server knows no address of its own: the proxy's entry is all there is.
        local = Client().get("/metrics", REMOTE_ADDR="", HTTP_X_FORWARDED_FOR="203.0.113.9, 127.0.0.1")
        forged = Client().get("/metrics", REMOTE_ADDR="", HTTP_X_FORWARDED_FOR="127.0.0.1, 203.0.113.9")

    assert local.status_code == 200
    assert forged.status_code == 403


@pytest.mark.django_db
@override_settings(PORTAL_METRICS_TOKEN="scrape-secret")
def test_with_a_token_set_a_scrape_without_it_is_refused() -> None:
    missing = Client().get("/metrics")
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer not-it")
    right = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret")

    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert missing.json() == {
        "code": "not_authenticated",
        "message": "The metrics need the scrape token: send it as 'Authorization: Bearer <PORTAL_METRICS_TOKEN>'.",
        "fields": {},
    }


@pytest.mark.django_db
@override_settings(PORTAL_METRICS=False)
def test_metrics_turned_off_are_not_there() -> None:
    response = Client().get("/metrics")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_an_allow_list_entry_that_is_no_network_stops_the_portal_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTAL_METRICS_ALLOW", "127.0.0.1/32,intranet")
    with pytest.raises(ConfigurationError, match="'intranet' is not an address or a network"):
        env_networks("PORTAL_METRICS_ALLOW", [])


# What it counts -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_requests_are_counted_by_route_and_status_and_timed() -> None:
    before = scrape()

    Client().get("/api/v1/me/")  # 401: not signed in
    Client().get("/api/v1/me/")
    Client().get("/api/v1/no-such-thing/")  # no route: never its raw path

    after = scrape()
    assert delta(before, after, "portal_http_requests_total", route="api-me", method="GET", status="401") == 2
    assert delta(before, after, "portal_http_request_duration_seconds_count", route="api-me", method="GET") == 2
    assert delta(before, after, "portal_http_requests_total", route="unmatched", method="GET", status="404") == 1
    # The first scrape counts once it has answered: the second one sees it.
    assert delta(before, after, "portal_http_requests_total", route="metrics", method="GET", status="200") == 1
    assert not any("no-such-thing" in str(labels) for _, labels in after)


def _submitter(gpu_hours: str, *, gpu_type: str = "h100") -> tuple[Any, APIClient]:
    cluster = make_matrix_cluster()
    project = make_project(make_tenant())
    member = make_user()
    add_project_member(project, member, "member")
    ClusterAccount.objects.create(cluster=cluster, user=member, username="alice")
    grant_allocation(project, cluster, gpu_hours, gpu_type=gpu_type)
    api = APIClient()
    api.force_authenticate(member)
    return project, api


def _submit(api: APIClient, project: Any, **fields: Any) -> int:
    body = {"project": f"{project.tenant.slug}/{project.slug}", "cluster": "matrixcluster", "script": SCRIPT}
    return api.post("/api/v1/jobs/", {**body, **fields}, format="json").status_code


@pytest.mark.django_db
def test_submissions_accepted_and_refused_are_counted_with_their_reason_and_reservation() -> None:
    project, api = _submitter("1")
    before = scrape()

    assert _submit(api, project, gpus=1, time_limit_minutes=30, gpu_type="h100") == 202
    assert _submit(api, project, gpus=2, time_limit_minutes=60, gpu_type="h100") == 409  # 2 h asked, 0.5 h left
    assert _submit(api, project, gpus=99) == 400
    assert _submit(api, project, gpus=1, time_limit_minutes=10, cluster="nowhere") == 400

    after = scrape()
    cluster = {"cluster": "matrixcluster"}
    assert delta(before, after, "portal_jobs_accepted_total", **cluster) == 1
    assert delta(before, after, "portal_quota_reservations_total", **cluster) == 1
    assert delta(before, after, "portal_quota_reserved_gpu_seconds_total", **cluster) == 1800
    assert delta(before, after, "portal_jobs_refused_total", **cluster, reason="quota_exceeded") == 1
    assert delta(before, after, "portal_quota_refusals_total", **cluster, reason="quota_exceeded") == 1
    assert delta(before, after, "portal_jobs_refused_total", **cluster, reason="invalid") == 1
    # A cluster name the user made up never becomes a label.
    assert delta(before, after, "portal_jobs_refused_total", cluster="", reason="invalid") == 1
    assert not any(("cluster", "nowhere") in labels for _, labels in after)


@pytest.mark.django_db
def test_a_gpu_type_without_an_allocation_is_counted_as_such() -> None:
    project, api = _submitter("1", gpu_type="a100")
    before = scrape()

    assert _submit(api, project, gpus=1, time_limit_minutes=10, gpu_type="h100") == 409

    after = scrape()
    cluster = {"cluster": "matrixcluster"}
    assert delta(before, after, "portal_jobs_refused_total", **cluster, reason="no_allocation") == 1
    assert delta(before, after, "portal_quota_refusals_total", **cluster, reason="no_allocation") == 1
    assert delta(before, after, "portal_jobs_accepted_total", **cluster) == 0


# The state of the world, read at scrape time ---------------------------------------------------------------------


def _job(cluster: Cluster, project: Any, user: Any, *, state: str, age_seconds: float) -> Job:
    """A job row as the services would have left it, without a delivery task (no worker must take it)."""
    created = timezone.now() - timedelta(seconds=age_seconds)
    return Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username="alice",
        name="waiting",
        partition="gpu",
        gpus=1,
        time_limit_minutes=5,
        script=SCRIPT,
        state=state,
        created_at=created,
        updated_at=created,
    )


@pytest.mark.django_db
def test_queues_sync_lag_health_and_reconciliation_come_from_the_database() -> None:
    now = timezone.now()
    cluster = make_matrix_cluster("gauged")
    Cluster.objects.filter(pk=cluster.pk).update(
        last_ping_ok=False, last_ping_at=now - timedelta(seconds=40), jobs_synced_at=now - timedelta(seconds=90)
    )
    project, user = make_project(make_tenant()), make_user()
    for age in (600, 30):
        _job(cluster, project, user, state=JobState.QUEUED, age_seconds=age)
    _job(cluster, project, user, state=JobState.RUNNING, age_seconds=900)
    _job(cluster, project, user, state=JobState.COMPLETED, age_seconds=900)
    ReconciliationReport.objects.create(
        cluster=cluster,
        period_start=now - timedelta(days=30),
        period_end=now,
        state=ReconciliationState.DONE,
        finished_at=now,
        summary={"counts": {"missing_in_portal": 3, "gpu_seconds_differ": 1}, "difference_gpu_seconds": -120},
    )
    SlurmDriftReport.objects.create(
        cluster=cluster,
        started_at=now,
        finished_at=now,
        findings=[{"kind": "gpu_limit", "repaired": True}, {"kind": "unknown_account", "repaired": False}],
    )
    make_matrix_cluster("quiet")

    samples = scrape()

    gauged = {"cluster": "gauged"}
    assert value(samples, "portal_cluster_up", **gauged) == 0
    assert 40 <= value(samples, "portal_cluster_check_age_seconds", **gauged) < 100
    assert 90 <= value(samples, "portal_job_sync_age_seconds", **gauged) < 150
    assert value(samples, "portal_jobs", **gauged, state="queued") == 2
    assert value(samples, "portal_jobs", **gauged, state="pending") == 0
    assert value(samples, "portal_jobs", **gauged, state="running") == 1
    assert 600 <= value(samples, "portal_jobs_queued_oldest_age_seconds", **gauged) < 660
    assert value(samples, "portal_reconciliation_differences", **gauged, kind="missing_in_portal") == 3
    assert value(samples, "portal_reconciliation_differences", **gauged, kind="gpu_seconds_differ") == 1
    assert value(samples, "portal_reconciliation_differences", **gauged, kind="missing_in_slurm") == 0
    assert value(samples, "portal_reconciliation_difference_gpu_seconds", **gauged) == -120
    assert value(samples, "portal_slurm_drift_findings", **gauged, repaired="false") == 1
    assert value(samples, "portal_slurm_drift_findings", **gauged, repaired="true") == 1
    # A cluster never checked nor synced: +Inf, which every "too long ago" alert catches; nothing queued.
    assert value(samples, "portal_cluster_check_age_seconds", cluster="quiet") == float("inf")
    assert value(samples, "portal_jobs_queued_oldest_age_seconds", cluster="quiet") == 0
    assert ("portal_reconciliation_difference_gpu_seconds", frozenset({("cluster", "quiet")})) not in samples


@pytest.mark.django_db(transaction=True)
def test_open_websockets_are_counted_by_route_until_they_close() -> None:
    from portal.asgi import application

    user = make_user()
    client = Client()
    client.force_login(user)
    headers = [
        (b"origin", b"http://127.0.0.1:8000"),
        (b"host", b"127.0.0.1:8000"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
    ]
    route = {"route": "ws/clusters/"}
    before = scrape()

    async def open_then_close() -> tuple[Samples, Samples]:
        communicator = WebsocketCommunicator(application, "/ws/clusters/", headers=headers)
        assert await handshake(communicator) == (True, None)
        refused = WebsocketCommunicator(application, "/ws/clusters/", headers=headers[:2])  # anonymous: 4401
        assert await handshake(refused) == (False, 4401)
        await refused.wait()
        while_open = await _scrape_async()
        await communicator.disconnect()
        return while_open, await _scrape_async()

    while_open, closed = async_to_sync(open_then_close)()

    assert delta(before, while_open, "portal_websockets_open", **route) == 1
    assert delta(before, closed, "portal_websockets_open", **route) == 0


async def _scrape_async() -> Samples:
    from asgiref.sync import sync_to_async

    return await sync_to_async(scrape)()


def _portal_starts(**environment: str) -> subprocess.CompletedProcess[str]:
    """A fresh process with the portal's own settings and only these variables."""
    clean = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "portal.settings", **environment}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2],
        env={**clean, "PORTAL_SECRET_KEY": "k3y-" + "x" * 60},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_metrics_open_to_any_address_without_a_token_stop_the_portal_at_start() -> None:
    refused = _portal_starts(PORTAL_METRICS_ALLOW="")
    with_token = _portal_starts(PORTAL_METRICS_ALLOW="", PORTAL_METRICS_TOKEN="scrape-secret")

    assert refused.returncode != 0
    assert "anyone could read /metrics" in refused.stderr
    assert with_token.returncode == 0, with_token.stderr
