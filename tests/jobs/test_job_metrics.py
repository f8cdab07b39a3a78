"""One scrape of the real web tier sums every process's metrics: gunicorn's two workers, a real Celery worker and
this process, writing to one PROMETHEUS_MULTIPROC_DIR as scripts/portal.sh runs them (README, "Metrics and alerts").
Against the local Slurm cluster."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from jobs.models import Job
from jobs.tasks import cluster_jobs_sync
from tests.conftest import wait_until
from tests.jobs.conftest import LiveProject
from tests.metrics import Samples, delta, parse

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def scrape(base_url: str) -> Samples:
    response = httpx.get(f"{base_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return parse(response.text)


def test_one_scrape_sums_the_web_workers_the_celery_worker_and_the_api(
    wsgi_portal: str, celery_worker: str, live_project: LiveProject
) -> None:
    cluster = {"cluster": live_project.cluster.name}
    before = scrape(wsgi_portal)

    # Four clients at once: gunicorn's two workers both answer, each into its own file.
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(lambda _: httpx.get(f"{wsgi_portal}/api/v1/me/").status_code, range(24)))
    assert statuses == [401] * 24
    # Accepted here, delivered by the worker.
    submitted = [str(live_project.submit()["id"]) for _ in range(2)]
    wait_until(
        lambda: delta(before, scrape(wsgi_portal), "portal_job_deliveries_total", **cluster, outcome="delivered") == 2,
        what="both deliveries counted",
    )
    assert Job.objects.filter(pk__in=submitted, slurm_job_id__isnull=False).count() == 2
    # A job sync run by the worker, as beat would ask for it.
    cluster_jobs_sync.delay(live_project.cluster.pk)
    task = {"task": "jobs.tasks.cluster_jobs_sync"}
    wait_until(
        lambda: delta(before, scrape(wsgi_portal), "portal_celery_tasks_total", **task, outcome="success") == 1,
        what="the sync task counted",
    )

    after = scrape(wsgi_portal)
    assert delta(before, after, "portal_http_requests_total", route="api-me", method="GET", status="401") == 24
    assert delta(before, after, "portal_jobs_accepted_total", **cluster) == 2
    assert delta(before, after, "portal_quota_reserved_gpu_seconds_total", **cluster) == 2 * 2 * 60
    assert delta(before, after, "portal_job_delivery_lag_seconds_count", **cluster) == 2
    slurm_job = {**cluster, "api_version": live_project.cluster.api_version, "endpoint": "slurm/job"}
    assert delta(before, after, "portal_slurmrestd_requests_total", **slurm_job, method="POST") == 2
    assert delta(before, after, "portal_job_sync_duration_seconds_count", **cluster, outcome="ok") == 1
    assert delta(before, after, "portal_celery_task_age_seconds_count", **task) == 1
    assert delta(before, after, "portal_celery_task_duration_seconds_count", **task) == 1
    deliveries = {"task": "jobs.tasks.job_submit", "outcome": "success"}
    assert delta(before, after, "portal_celery_tasks_total", **deliveries) >= 1  # one message may deliver both
