"""A name search pages by cursor within windows of time (portal.keyset.windowed_keyset_page): its pages are the
very pages of the plain keyset walk, in both directions, wherever the matches lie in time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.selectors import JOB_SEARCH_SPAN, job_list_window
from portal.keyset import KeysetPage, WindowedPage, keyset_page, windowed_keyset_page
from tests.factories import make_job

pytestmark = pytest.mark.django_db

Pager = Callable[[str | None], KeysetPage[Job]]


def _jobs(ages_days: list[float], name: str) -> None:
    """Jobs named `name` created that many days ago, beside the first job's project."""
    first = Job.objects.first() or make_job(name="unrelated")
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            project=first.project,
            cluster=first.cluster,
            user=first.user,
            cluster_username="alice",
            name=name,
            partition="gpu",
            gpus=1,
            time_limit_minutes=5,
            state=first.state,
            created_at=now - timedelta(days=age),
        )
        for age in ages_days
    )


def _walk(pager: Pager) -> tuple[list[list[str]], list[list[str]]]:
    """Every page from the newest to the oldest by `older` cursors, then back by `newer` ones."""
    older_pages, page = [], pager(None)
    older_pages.append([str(job.pk) for job in page.rows])
    while page.older:
        page = pager(page.older)
        older_pages.append([str(job.pk) for job in page.rows])
    newer_pages = [older_pages[-1]]
    while page.newer:
        page = pager(page.newer)
        newer_pages.append([str(job.pk) for job in page.rows])
    return older_pages, newer_pages


def _searched() -> object:
    return Job.objects.filter(name__icontains="sweep")


@pytest.mark.parametrize(
    "ages",
    [
        # Many recent matches, some a season old, a few a year old.
        [i / 10 for i in range(30)] + [100 + i for i in range(10)] + [400 + i for i in range(5)],
        # One a day for two months: the first week holds less than a page, a longer span holds one.
        [float(i) for i in range(60)],
        # Only old ones: the whole list is searched.
        [300 + i / 3 for i in range(25)],
        # Ties: several jobs created at the same moment.
        [1.0] * 12 + [2.0] * 12,
    ],
)
def test_the_windowed_pages_are_the_plain_pages(ages: list[float]) -> None:
    _jobs(ages, "sweep-a")
    _jobs([i / 5 for i in range(40)], "other")  # recent jobs that do not match, between the matches

    def plain(cursor: str | None) -> KeysetPage[Job]:
        return keyset_page(_searched(), cursor=cursor, size=10)  # type: ignore[arg-type]

    assert _walk(_windowed) == _walk(plain)
    assert sum(len(page) for page in _walk(_windowed)[0]) == len(ages)


def _windowed(cursor: str | None) -> WindowedPage[Job]:
    return windowed_keyset_page(
        _searched(),  # type: ignore[arg-type]
        cursor=cursor,
        size=10,
        window=job_list_window,
        span=JOB_SEARCH_SPAN,
    )


def _first_page() -> WindowedPage[Job]:
    return _windowed(None)


def test_a_page_is_found_in_the_shortest_span_that_holds_it() -> None:
    _jobs([i / 10 for i in range(30)] + [100 + i for i in range(10)], "sweep")
    assert _first_page().span == JOB_SEARCH_SPAN
    # Three matches in the first week: a page needs a span of 2 * 11 / 3 weeks, rounded up to whole weeks.
    Job.objects.filter(name="sweep").delete()
    _jobs([1.0, 2.0, 3.0] + [8.0 + i / 2 for i in range(30)], "sweep")
    assert _first_page().span == JOB_SEARCH_SPAN * 8
    # None in the first week, or so few that the next span would be half a year: the whole list.
    Job.objects.filter(name="sweep").delete()
    _jobs([300.0 + i for i in range(30)], "sweep")
    whole = _first_page()
    assert whole.span is None
    assert len(whole.rows) == 10
