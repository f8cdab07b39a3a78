"""The Celery application: workers and beat load Django settings and discover each app's tasks."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_process_init

from portal.metrics import celery_signals_connect

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Every process that sends tasks stamps them, and every worker counts and times what it runs (README, "Metrics").
celery_signals_connect()


@worker_process_init.connect
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


@task_prerun.connect
@task_postrun.connect
def _database_connections_checked(task: Any = None, **kwargs: Any) -> None:
    """Around each task, as Django does around each request: close a connection that broke (PostgreSQL
    restarted) or outlived its age, so the next query opens a fresh one. Not for a task run in the caller's
    process (eager), whose connection, and transaction, are the caller's."""
    from django.db import close_old_connections

    if task is not None and not getattr(task.request, "is_eager", False):
        close_old_connections()
