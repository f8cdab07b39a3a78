"""Keyset (cursor) pages over a list ordered newest first by (created_at, id), and counts that stay cheap.

A page by number makes the database walk past every row before it (OFFSET), and its "page x of y" counts every
row the user can see: both grow with the history. A cursor names the last row shown instead, so the next page
starts where an index says, however deep; the count stops at COUNT_LIMIT and is then said as "more than".
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from django.db.models import Model, Q, QuerySet
from django.utils.timezone import now as timezone_now

M = TypeVar("M", bound=Model)

# The most rows a list counts exactly; past it a list says "more than 1,000".
COUNT_LIMIT = 1000
OLDER, NEWER = "o", "n"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class CursorInvalid(ValueError):
    pass


@dataclass(frozen=True)
class Cursor:
    direction: str  # OLDER: the rows after this one in the list; NEWER: the rows before it
    created_at: datetime
    pk: str

    def encode(self) -> str:
        microseconds = (self.created_at - _EPOCH) // _MICROSECOND
        raw = f"{self.direction}{microseconds}~{self.pk}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            direction, rest = raw[0], raw[1:]
            microseconds, pk = rest.split("~", 1)
            created_at = _EPOCH + int(microseconds) * _MICROSECOND
        except (ValueError, IndexError, UnicodeDecodeError, binascii.Error, OverflowError, OSError):
            raise CursorInvalid(f"'{text[:40]}' is not a cursor of this list; follow the list's next link.") from None
        if direction not in (OLDER, NEWER) or not pk:
            raise CursorInvalid(f"'{text[:40]}' is not a cursor of this list; follow the list's next link.")
        return cls(direction=direction, created_at=created_at, pk=pk)

    @classmethod
    def of(cls, row: Model, direction: str) -> Cursor:
        return cls(direction=direction, created_at=row.created_at, pk=str(row.pk))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class KeysetPage(Generic[M]):
    rows: list[M]
    older: str | None  # the cursor of the next (older) page, None on the last one
    newer: str | None  # the cursor of the previous (newer) page, None on the first one

    @property
    def is_first(self) -> bool:
        return self.newer is None


# Narrows a list to the rows created since a time (or until one, the other bound None), in a way an index serves.
Window = Callable[[QuerySet[M], datetime | None, datetime | None], QuerySet[M]]


# A window this long holds most of a list's history: reading the whole list costs about as much.
WHOLE_LIST_SPAN = timedelta(days=180)


@dataclass(frozen=True)
class WindowedPage(KeysetPage[M]):
    span: timedelta | None = None  # the window the page was found in; None: the whole list was searched
    # On the first page found in a window: how many rows the window holds (up to COUNT_LIMIT), "at least" so many.
    in_window: BoundedCount | None = None


def windowed_keyset_page(
    queryset: QuerySet[M], *, cursor: str | None, size: int, window: Window[M], span: timedelta
) -> WindowedPage[M]:
    """`keyset_page` for a list whose index finds its rows in time order only within a window of time (a name
    search: its trigram index has no order, so the newest matches are found by reading every match, however
    old). The page is looked for among the rows within `span` of the cursor (of now, on the first page), then
    within a span as long as that one's share of matches says a page needs (twice that, for luck), and in the
    whole list when neither holds a full page (or the second span would be WHOLE_LIST_SPAN or longer: the matches
    are few, and then reading them all costs little): the cost follows the rows near the page, not the history.
    The spans are probed for keys only (on the first page up to COUNT_LIMIT + 1 of them, which counts the rows
    within the span in the same scan); the page's rows are read by key once found."""
    position = Cursor.decode(cursor) if cursor else None
    probe = max(size, COUNT_LIMIT) + 1 if position is None else size + 1
    for _ in range(2):
        if position is None:
            narrowed = window(queryset, timezone_now() - span, None)
        elif position.direction == OLDER:
            narrowed = window(queryset, position.created_at - span, None)
        else:
            narrowed = window(queryset, None, position.created_at + span)
        keys = list(_walk(narrowed, position).values_list("pk", flat=True)[:probe])
        if len(keys) > size:  # a full page, and more beyond it inside the span
            page = _page_of(list(_walk(queryset, position).filter(pk__in=keys[: size + 1])), position, size)
            found = None
            if position is None:
                exact = len(keys) <= COUNT_LIMIT
                found = BoundedCount(count=min(len(keys), COUNT_LIMIT), exact=False, at_least=exact)
            return WindowedPage(rows=page.rows, older=page.older, newer=page.newer, span=span, in_window=found)
        if not keys:
            break
        span *= math.ceil(2 * (size + 1) / len(keys))
        if span >= WHOLE_LIST_SPAN:
            break
    page = keyset_page(queryset, cursor=cursor, size=size)
    return WindowedPage(rows=page.rows, older=page.older, newer=page.newer)


def keyset_page(queryset: QuerySet[M], *, cursor: str | None, size: int, oldest_first: bool = False) -> KeysetPage[M]:
    """The page of `queryset` (any filters; rows ordered by -created_at, -pk here, or the other way round when
    `oldest_first`: then `older` is the next page's cursor and `newer` the previous one's) that `cursor` points
    to, the first page without one. One query, reading at most size + 1 rows from where the cursor points."""
    position = Cursor.decode(cursor) if cursor else None
    return _page_of(list(_walk(queryset, position, oldest_first=oldest_first)[: size + 1]), position, size)


def _walk(queryset: QuerySet[M], position: Cursor | None, *, oldest_first: bool = False) -> QuerySet[M]:
    """The rows from where `position` points, in the order a page reads them: the next ones in the list's order,
    the previous ones in the other."""
    forward = ("created_at", "pk") if oldest_first else ("-created_at", "-pk")
    backward = ("-created_at", "-pk") if oldest_first else ("created_at", "pk")
    if position is None:
        return queryset.order_by(*forward)
    at, pk = position.created_at, position.pk
    # The first condition of each is the index's range (created_at <= at); the second breaks ties by id.
    before = Q(created_at__lte=at) & (Q(created_at__lt=at) | Q(pk__lt=pk))
    after = Q(created_at__gte=at) & (Q(created_at__gt=at) | Q(pk__gt=pk))
    if position.direction == OLDER:
        return queryset.order_by(*forward).filter(after if oldest_first else before)
    return queryset.order_by(*backward).filter(before if oldest_first else after)


def _page_of(rows: list[M], position: Cursor | None, size: int) -> KeysetPage[M]:
    """The page of the first size + 1 rows `_walk` gave (the extra row only says that there are more)."""
    more, rows = len(rows) > size, rows[:size]
    if position is None:
        return KeysetPage(rows=rows, older=Cursor.of(rows[-1], OLDER).encode() if more else None, newer=None)
    if position.direction == OLDER:
        older = Cursor.of(rows[-1], OLDER).encode() if more else None
        newer = Cursor.of(rows[0], NEWER).encode() if rows else None
        return KeysetPage(rows=rows, older=older, newer=newer)
    rows.reverse()
    older = Cursor.of(rows[-1], OLDER).encode() if rows else None
    return KeysetPage(rows=rows, older=older, newer=Cursor.of(rows[0], NEWER).encode() if more else None)


@dataclass(frozen=True)
class BoundedCount:
    count: int  # exact when `exact`, else COUNT_LIMIT: there are more
    exact: bool
    at_least: bool = False  # not exact, and count is what was found, not a limit: there may be more

    def __str__(self) -> str:
        if self.at_least:
            return f"at least {self.count:,}"
        return f"{self.count:,}" if self.exact else f"more than {self.count:,}"


def bounded_count(queryset: QuerySet[M], *, limit: int | None = None) -> BoundedCount:
    """How many rows `queryset` has, counted up to `limit` (COUNT_LIMIT) only: `SELECT count(*) FROM (... LIMIT
    limit + 1)`."""
    limit = COUNT_LIMIT if limit is None else limit
    found = queryset.order_by().values("pk")[: limit + 1].count()
    return BoundedCount(count=min(found, limit), exact=found <= limit)
