"""The one way work is handed to the Celery workers: after the transaction commits, by the task's registered name.

By name, so that a lower app can have a higher one's task run without importing it (tenants asks for the
clusters' Slurm sync, quotas for its own limit sync). After commit, so that the worker sees what the task is
about. And a broker that is down is logged, never raised: the database already holds the truth, and every
task sent this way has a periodic sweep, sync or reconcile that does the same work later (`fallback` says
which, for the log). The message carries the id of the request that sent it, so the task's log lines do too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction

from portal.request_ids import current_request_id

logger = logging.getLogger(__name__)


def task_enqueue_on_commit(
    task_name: str, *args: object, fallback: str, only_if: Callable[[], bool] | None = None
) -> None:
    """Send the task `task_name` (e.g. "jobs.tasks.job_submit") with `args` once the current transaction commits;
    with `only_if`, only when it answers True then (after the commit: what it checks must see the new rows)."""

    def send() -> None:
        if only_if is not None and not only_if():
            return
        # The Celery app imports settings; load it only when sending.
        from portal.celery import REQUEST_ID_HEADER, app

        request_id = current_request_id()
        try:
            app.send_task(task_name, args=args, headers={REQUEST_ID_HEADER: request_id} if request_id else None)
        except Exception:  # the broker (Redis) is down or unreachable
            logger.warning("could not enqueue %s%r; %s", task_name, args, fallback, exc_info=True)

    transaction.on_commit(send)
