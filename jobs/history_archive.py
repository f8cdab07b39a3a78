"""Old job transitions: moved to an archive table in short batches, read back in timelines and a tenant's export.

The transitions are the largest table of the history (four or more per job, forever); everything else stays where
it is (README, "Old history: the transitions archive"). A transition older than HISTORY_ARCHIVE_AFTER_MONTHS moves,
with its id, in batches of one statement each: the batch is chosen by the index on `at`, locked with SKIP LOCKED
(a row a sync is touching waits for the next run), deleted and inserted into the archive in the same statement,
so a crash between or inside batches loses and duplicates nothing, and a second run finds nothing left to move.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from jobs.models import JobTransitionArchive
from tenants.models import Tenant

ARCHIVE_BATCH_SIZE = 5_000
EXPORT_PAGE_SIZE = 2_000
# One statement: the oldest `size` transitions before the cutoff that nobody holds, out of the hot table and into
# the archive. ON CONFLICT cannot fire while every batch is one statement; it keeps a hand-copied row harmless.
_MOVE_BATCH = """
WITH batch AS (
    SELECT id FROM jobs_jobtransition WHERE at < %(before)s ORDER BY at LIMIT %(size)s FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM jobs_jobtransition hot USING batch WHERE hot.id = batch.id
    RETURNING hot.id, hot.job_id, hot.from_state, hot.to_state, hot.at, hot.detail
), archived AS (
    INSERT INTO jobs_jobtransitionarchive (id, job_id, from_state, to_state, at, detail)
    SELECT id, job_id, from_state, to_state, at, detail FROM moved
    ON CONFLICT (id) DO NOTHING RETURNING id
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM archived)
"""


@dataclass(frozen=True)
class ArchiveRun:
    before: datetime
    moved: int  # transitions moved out of the hot table
    batches: int
    longest_batch_seconds: float  # the longest that one batch held its row locks (its whole transaction)
    seconds: float


def archive_cutoff(*, now: datetime | None = None, months: int | None = None) -> datetime:
    """The same day and time `months` calendar months before `now` (the month's last day where it is shorter)."""
    now = now or timezone.now()
    months = settings.HISTORY_ARCHIVE_AFTER_MONTHS if months is None else months
    year, month = divmod(now.year * 12 + now.month - 1 - months, 12)
    day = min(now.day, calendar.monthrange(year, month + 1)[1])
    return now.replace(year=year, month=month + 1, day=day)


def job_transitions_archive(
    *, before: datetime, batch_size: int = ARCHIVE_BATCH_SIZE, max_batches: int | None = None
) -> ArchiveRun:
    """Move every transition recorded before `before` to the archive, `batch_size` at a time, each batch its own
    transaction; stop after `max_batches` (the rest waits for the next run). Idempotent."""
    started = time.monotonic()
    moved = batches = 0
    longest = 0.0
    while max_batches is None or batches < max_batches:
        batch_started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_MOVE_BATCH, {"before": before, "size": batch_size})
            row = cursor.fetchone()
        longest = max(longest, time.monotonic() - batch_started)
        count = int(row[0]) if row else 0
        if count == 0:
            break
        moved += count
        batches += 1
    return ArchiveRun(
        before=before, moved=moved, batches=batches, longest_batch_seconds=longest, seconds=time.monotonic() - started
    )


def archived_transitions_export(*, tenant: Tenant, project_slug: str | None = None) -> Iterator[str]:
    """The tenant's archived transitions as JSON lines, oldest first, one chunk of lines per page of
    EXPORT_PAGE_SIZE read by keyset on (at, id): no query, cursor or transaction stays open between chunks (the
    caller has checked that the user may manage the tenant)."""
    rows = JobTransitionArchive.objects.filter(job__project__tenant=tenant).order_by("at", "id")
    if project_slug is not None:
        rows = rows.filter(job__project__slug=project_slug)
    columns = rows.values_list(
        "id", "job_id", "job__project__slug", "job__name", "job__user__username", "from_state", "to_state", "at",
        "detail",
    )  # fmt: skip
    page = list(columns[:EXPORT_PAGE_SIZE])
    while page:
        yield "".join(_export_line(tenant, row) for row in page)
        last_id, last_at = page[-1][0], page[-1][7]
        # `at >= last` first, so that the index on (at, id) starts the page there rather than filtering up to it.
        after = Q(at__gte=last_at) & (Q(at__gt=last_at) | Q(id__gt=last_id))
        page = list(columns.filter(after)[:EXPORT_PAGE_SIZE]) if len(page) == EXPORT_PAGE_SIZE else []


def _export_line(tenant: Tenant, row: tuple[Any, ...]) -> str:
    id_, job_id, project, name, username, from_state, to_state, at, detail = row
    line = {
        "id": id_,
        "job": str(job_id),
        "project": f"{tenant.slug}/{project}",
        "job_name": name,
        "user": username,
        "from_state": from_state,
        "to_state": to_state,
        "at": at.isoformat(),
        "detail": detail,
    }
    return json.dumps(line) + "\n"
