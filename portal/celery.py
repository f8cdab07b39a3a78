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

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

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
