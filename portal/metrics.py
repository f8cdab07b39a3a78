"""The portal's Prometheus metrics: what its processes count and time as they work (README, "Metrics and alerts").

Every process of a host (gunicorn's workers, uvicorn, the Celery worker's pool, beat) writes its values to files in
PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode), and one scrape of `/metrics` on any web process
sums them (`portal/metrics_views.py`). What is the state of the world rather than an event (jobs waiting per
cluster, how long ago each cluster was synced, reconciliation differences) is read from the database at scrape
time instead (`portal/metrics_state.py`), so it is right whichever process changed it.

Label values come from short, bounded sets only (cluster names, URL pattern names, task names, error kinds): never
a raw path, a job id or a tenant's name, so the number of series stays fixed and no tenant shows in them.
`PORTAL_METRICS=false` turns recording off (and `/metrics` with it), to measure what it costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter, Gauge, Histogram

# What the processes record ---------------------------------------------------------------------------------

HTTP_REQUESTS = Counter(
    "portal_http_requests",
    "HTTP requests answered, by route (the URL pattern's name), method and status",
    ["route", "method", "status"],
)
HTTP_REQUEST_DURATION = Histogram(
    "portal_http_request_duration_seconds",
    "Time from a request reaching Django to its response, by route and method",
    ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
JOBS_ACCEPTED = Counter("portal_jobs_accepted", "Job submissions accepted (stored queued), by cluster", ["cluster"])
JOBS_REFUSED = Counter(
    "portal_jobs_refused",
    "Job submissions refused, by cluster (empty when unknown) and reason (invalid, quota_exceeded, no_allocation)",
    ["cluster", "reason"],
)
JOB_DELIVERIES = Counter(
    "portal_job_deliveries",
    "Delivery attempts of queued jobs recorded by the workers, by cluster and outcome "
    "(delivered: in Slurm; rejected: refused by Slurm; cancelled: before it reached Slurm; retry: Slurm not answering)",
    ["cluster", "outcome"],
)
JOB_DELIVERY_LAG = Histogram(
    "portal_job_delivery_lag_seconds",
    "Time from a job's acceptance to its recorded delivery to Slurm, by cluster",
    ["cluster"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
JOB_SYNC_DURATION = Histogram(
    "portal_job_sync_duration_seconds",
    "Duration of one job sync of a cluster (one listing from slurmrestd, applied), by cluster and outcome",
    ["cluster", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
GPU_UTILISATION_CYCLE_SECONDS = Histogram(
    "portal_gpu_utilisation_cycle_seconds",
    "One collection of a cluster's GPU utilisation from its Prometheus (two queries) into its running jobs",
    ["cluster"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
SLURMRESTD_REQUESTS = Counter(
    "portal_slurmrestd_requests",
    "HTTP requests to slurmrestd, by cluster, API version, endpoint and method",
    ["cluster", "api_version", "endpoint", "method"],
)
SLURMRESTD_REQUEST_DURATION = Histogram(
    "portal_slurmrestd_request_duration_seconds",
    "Duration of one request to slurmrestd, by cluster and API version",
    ["cluster", "api_version"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
SLURMRESTD_ERRORS = Counter(
    "portal_slurmrestd_errors",
    "Failed requests to slurmrestd, by cluster, API version and kind (unavailable, timeout, server_error: retryable; "
    "rejected, auth, not_found: terminal)",
    ["cluster", "api_version", "kind"],
)
# Summed over the processes alive now: a uvicorn process that died takes its sockets with it.
WEBSOCKETS_OPEN = Gauge(
    "portal_websockets_open", "WebSockets open now, by route", ["route"], multiprocess_mode="livesum"
)
CELERY_TASKS = Counter(
    "portal_celery_tasks",
    "Celery tasks run, by task and outcome (success, failure, retry; expired and revoked: dropped unrun)",
    ["task", "outcome"],
)
CELERY_TASK_AGE = Histogram(
    "portal_celery_task_age_seconds",
    "Time a task waited between being sent (or its ETA) and a worker starting it, by task",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
CELERY_TASK_DURATION = Histogram(
    "portal_celery_task_duration_seconds",
    "Time a worker spent running a task, by task",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
QUOTA_RESERVATIONS = Counter(
    "portal_quota_reservations", "GPU-hour reservations made for accepted jobs, by cluster", ["cluster"]
)
QUOTA_RESERVED_GPU_SECONDS = Counter(
    "portal_quota_reserved_gpu_seconds", "GPU-seconds reserved for accepted jobs, by cluster", ["cluster"]
)
QUOTA_REFUSALS = Counter(
    "portal_quota_refusals",
    "Jobs refused for want of GPU-hours, by cluster and reason (quota_exceeded, no_allocation)",
    ["cluster", "reason"],
)


def metrics_enabled() -> bool:
    return bool(settings.PORTAL_METRICS)


def job_accepted(*, cluster: str, count: int = 1) -> None:
    if metrics_enabled():
        JOBS_ACCEPTED.labels(cluster).inc(count)


def job_refused(*, cluster: str, reason: str) -> None:
    if metrics_enabled():
        JOBS_REFUSED.labels(cluster, reason).inc()


def job_delivery_record(*, cluster: str, outcome: str, lag_seconds: float | None = None) -> None:
    if not metrics_enabled():
        return
    JOB_DELIVERIES.labels(cluster, outcome).inc()
    if lag_seconds is not None:
        JOB_DELIVERY_LAG.labels(cluster).observe(max(lag_seconds, 0.0))


def job_sync_observe(*, cluster: str, outcome: str, seconds: float) -> None:
    if metrics_enabled():
        JOB_SYNC_DURATION.labels(cluster, outcome).observe(seconds)


def quota_reserved(*, cluster: str, gpu_seconds: int) -> None:
    if metrics_enabled():
        QUOTA_RESERVATIONS.labels(cluster).inc()
        QUOTA_RESERVED_GPU_SECONDS.labels(cluster).inc(gpu_seconds)


def quota_refused(*, cluster: str, reason: str) -> None:
    if metrics_enabled():
        QUOTA_REFUSALS.labels(cluster, reason).inc()


class SlurmrestdMetrics:
    """The Slurm client's observer (`clusters.slurm.client.SlurmCallObserver`) for one cluster."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

    def request_done(self, *, api_version: str, method: str, endpoint: str, seconds: float) -> None:
        if metrics_enabled():
            SLURMRESTD_REQUESTS.labels(self.cluster, api_version, endpoint, method).inc()
            SLURMRESTD_REQUEST_DURATION.labels(self.cluster, api_version).observe(seconds)

    def request_failed(self, *, api_version: str, kind: str) -> None:
        if metrics_enabled():
            SLURMRESTD_ERRORS.labels(self.cluster, api_version, kind).inc()


# HTTP requests ---------------------------------------------------------------------------------------------

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
View = Callable[[HttpRequest], HttpResponse]


def route_of(request: HttpRequest) -> str:
    """The URL pattern's name (e.g. `api-jobs`, `admin:jobs_job_change`), its route where it has none, and
    `unmatched` for a request no pattern took (a 404, a redirect to the slash-ended address)."""
    match = request.resolver_match
    if match is None:
        return "unmatched"
    return match.view_name if match.url_name else match.route


def http_metrics_middleware(get_response: View) -> View:
    """Counts and times every request (outermost, so refusals by other middleware count too). No query, no
    lock beyond the metric files' own: this runs on every submission, whose time is budgeted."""

    def middleware(request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = get_response(request)
        seconds = time.perf_counter() - started
        route = route_of(request)
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
        HTTP_REQUEST_DURATION.labels(route, method).observe(seconds)
        return response

    return middleware


# WebSockets --------------------------------------------------------------------------------------------------


class WebsocketsCounted:
    """ASGI middleware that counts the WebSockets open now, by route (the route's pattern, from `routes`): from
    the server's accept to the end of the connection. Refusals count for the moment between their accept and
    close (the portal accepts, then closes with a code the browser can read)."""

    def __init__(self, application: Any, *, routes: Iterable[Any]) -> None:
        self.application = application
        self.patterns = [(entry.pattern.regex, str(entry.pattern)) for entry in routes]

    def route_of(self, path: str) -> str:
        path = path.lstrip("/")
        return next((route for regex, route in self.patterns if regex.match(path)), "unmatched")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket" or not metrics_enabled():
            return await self.application(scope, receive, send)
        gauge = WEBSOCKETS_OPEN.labels(self.route_of(scope.get("path", "")))
        accepted = False

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept" and not accepted:
                accepted = True
                gauge.inc()
            await send(message)

        try:
            return await self.application(scope, receive, counting_send)
        finally:
            if accepted:
                gauge.dec()


# Celery tasks ------------------------------------------------------------------------------------------------

# The header the sender stamps on each task message, read by the worker that starts it.
SENT_AT_HEADER = "portal_sent_at"
_started: dict[str, float] = {}


def celery_signals_connect() -> None:
    """Stamp each task message with the time it was sent, and count and time every task a worker runs."""
    from celery.signals import before_task_publish, task_postrun, task_prerun, task_revoked

    before_task_publish.connect(_stamp_sent_at, weak=False)
    task_prerun.connect(_task_started, weak=False)
    task_postrun.connect(_task_finished, weak=False)
    task_revoked.connect(_task_revoked, weak=False)


def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        headers.setdefault(SENT_AT_HEADER, time.time())


def _task_started(task_id: str = "", task: Any = None, **_: Any) -> None:
    if task is None or not metrics_enabled():
        return
    _started[task_id] = time.perf_counter()
    request = task.request
    sent_at = getattr(request, SENT_AT_HEADER, None)
    if not isinstance(sent_at, int | float):
        return
    due = float(sent_at)
    eta = getattr(request, "eta", None)
    if eta:
        due = max(due, datetime.fromisoformat(str(eta)).timestamp())
    CELERY_TASK_AGE.labels(task.name).observe(max(time.time() - due, 0.0))


def _task_finished(task_id: str = "", task: Any = None, state: str | None = None, **_: Any) -> None:
    started = _started.pop(task_id, None)
    if task is None or not metrics_enabled():
        return
    CELERY_TASKS.labels(task.name, (state or "unknown").lower()).inc()
    if started is not None:
        CELERY_TASK_DURATION.labels(task.name).observe(time.perf_counter() - started)


def _task_revoked(sender: Any = None, expired: bool = False, **_: Any) -> None:
    name = getattr(sender, "name", None)
    if metrics_enabled() and isinstance(name, str):
        CELERY_TASKS.labels(name, "expired" if expired else "revoked").inc()
