"""`GET /metrics`: every process's metrics of this host and the state gauges, in Prometheus' text format, for
scrapers from PORTAL_METRICS_ALLOW carrying PORTAL_METRICS_TOKEN when one is set (README, "Metrics and alerts")."""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os
import re
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from portal.api_errors import error_body
from portal.metrics_state import PortalStateCollector
from tenants.throttles import request_address

logger = logging.getLogger(__name__)

_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w+_(?P<pid>\d+)\.db$")


@functools.cache
def _registries() -> tuple[CollectorRegistry, ...]:
    """What a scrape reads: the files of every process of the host (multiprocess mode: PROMETHEUS_MULTIPROC_DIR
    set), or else this process's own metrics; and the state gauges from the database."""
    state = CollectorRegistry(auto_describe=False)
    state.register(PortalStateCollector())
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return (REGISTRY, state)
    processes = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(processes)  # type: ignore[no-untyped-call]
    return (processes, state)


def _forget_dead_processes() -> None:
    """Drop the live gauges (open WebSockets) of processes that ended without a hook saying so (gunicorn's
    child_exit says so for its workers; a killed uvicorn or Celery process cannot). Counters and histograms of
    ended processes stay: they still count. The directory is this host's alone, so a pid is this host's too."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    for path in Path(directory).glob("gauge_live*.db"):
        match = _LIVE_GAUGE_FILE.match(path.name)
        if match is None:
            continue
        pid = int(match.group("pid"))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
        except PermissionError:
            pass  # alive, under another user


def _address_allowed(request: HttpRequest) -> bool:
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = settings.PORTAL_METRICS_ALLOW
    if not networks:
        return True
    address = request_address(request)
    try:
        client = ipaddress.ip_address(address or "")
    except ValueError:
        return False  # a Unix socket's peer, or no address at all: not on any list
    return any(client in network for network in networks)


def _token_presented(request: HttpRequest) -> bool:
    expected: str = settings.PORTAL_METRICS_TOKEN
    if not expected:
        return True
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.PORTAL_METRICS:
        message = "Metrics are turned off on this portal (PORTAL_METRICS=false)."
        return JsonResponse(error_body(code="not_found", message=message), status=404)
    if not _address_allowed(request):
        message = (
            f"The metrics may not be read from {request_address(request) or 'this address'}: scrape from an "
            "address in PORTAL_METRICS_ALLOW."
        )
        return JsonResponse(error_body(code="permission_denied", message=message), status=403)
    if not _token_presented(request):
        message = "The metrics need the scrape token: send it as 'Authorization: Bearer <PORTAL_METRICS_TOKEN>'."
        response = JsonResponse(error_body(code="not_authenticated", message=message), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    _forget_dead_processes()
    body = b"".join(generate_latest(registry) for registry in _registries())
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
