"""The Celery application: workers and beat load Django settings and discover each app's tasks.

Their logs are the portal's (portal/logs.py): Celery is told not to set up its own, and each task's lines carry
its id, its name and the id of the request that sent it (`portal.queue` puts it in the message's headers).
"""

from __future__ import annotations

import logging.config
import os
from typing import Any

from celery import Celery, signals
from structlog.contextvars import bind_contextvars, clear_contextvars

from portal.metrics import celery_signals_connect

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Every process that sends tasks stamps them, and every worker counts and times what it runs (README, "Metrics").
celery_signals_connect()


@signals.worker_process_init.connect
def _database_connections_kept(**kwargs: Any) -> None:
    """A worker process keeps its database connection across tasks (CELERY_WORKER_DATABASE_CONN_MAX_AGE).

    A pool process runs one task at a time on one thread, so a kept connection is never shared. Set here rather
    than by whoever starts the worker: every way of starting one (scripts/portal.sh, systemd, the tests) gets it.
    A pooled configuration (DATABASE_POOL_SIZE) keeps its own connections and is left alone.
    """
    from django.conf import settings

    database: dict[str, Any] = settings.DATABASES["default"]
    if settings.CELERY_WORKER_DATABASE_CONN_MAX_AGE and not database.get("OPTIONS", {}).get("pool"):
        database["CONN_MAX_AGE"] = settings.CELERY_WORKER_DATABASE_CONN_MAX_AGE
        database["CONN_HEALTH_CHECKS"] = True


@signals.task_prerun.connect
@signals.task_postrun.connect
def _database_connections_checked(task: Any = None, **kwargs: Any) -> None:
    """Around each task, as Django does around each request: close a connection that broke (PostgreSQL
    restarted) or outlived its age, so the next query opens a fresh one. Not for a task run in the caller's
    process (eager), whose connection, and transaction, are the caller's."""
    from django.db import close_old_connections

    if task is not None and not getattr(task.request, "is_eager", False):
        close_old_connections()


# The message header that carries the id of the request a task was sent for (portal/request_ids.py).
REQUEST_ID_HEADER = "portal_request_id"


@signals.setup_logging.connect
def _portal_logging(**_: Any) -> None:
    # Connected, this replaces Celery's own set-up: workers and beat log as the web servers do, at
    # PORTAL_LOG_LEVEL. What is printed rather than logged (the demo's e-mails, from the console backend) still
    # goes through logging, as Celery would have it, so that a log holds only formatted lines.
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if app.conf.worker_redirect_stdouts:
        app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)


@signals.task_prerun.connect
def _task_ids_bound(task_id: str, task: Any, **_: Any) -> None:
    # A worker process runs one task at a time (solo and prefork pools): what the last one bound goes first.
    clear_contextvars()
    bind_contextvars(task_id=task_id, task=task.name, request_id=getattr(task.request, REQUEST_ID_HEADER, None))


@signals.task_postrun.connect
def _task_ids_unbound(**_: Any) -> None:
    clear_contextvars()
