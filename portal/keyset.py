"""Keyset (cursor) pages over a list ordered newest first by (created_at, id), and counts that stay cheap.

A page by number makes the database walk past every row before it (OFFSET), and its "page x of y" counts every
row the user can see: both grow with the history. A cursor names the last row shown instead, so the next page
starts where an index says, however deep; the count stops at COUNT_LIMIT and is then said as "more than".
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from django.db.models import Model, Q, QuerySet

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


def keyset_page(queryset: QuerySet[M], *, cursor: str | None, size: int) -> KeysetPage[M]:
    """The page of `queryset` (any filters; rows ordered by -created_at, -pk here) that `cursor` points to, the
    first page without one. One query, reading at most size + 1 rows from where the cursor points."""
    position = Cursor.decode(cursor) if cursor else None
    ordered = queryset.order_by("-created_at", "-pk")
    if position is None:
        rows = list(ordered[: size + 1])
        more, rows = len(rows) > size, rows[:size]
        return KeysetPage(rows=rows, older=Cursor.of(rows[-1], OLDER).encode() if more else None, newer=None)
    at, pk = position.created_at, position.pk
    if position.direction == OLDER:
        # The first condition is the index's range (created_at <= at); the second breaks ties by id.
        rows = list(ordered.filter(Q(created_at__lte=at) & (Q(created_at__lt=at) | Q(pk__lt=pk)))[: size + 1])
        more, rows = len(rows) > size, rows[:size]
        older = Cursor.of(rows[-1], OLDER).encode() if more else None
        newer = Cursor.of(rows[0], NEWER).encode() if rows else None
        return KeysetPage(rows=rows, older=older, newer=newer)
    newest_first = queryset.order_by("created_at", "pk")
    rows = list(newest_first.filter(Q(created_at__gte=at) & (Q(created_at__gt=at) | Q(pk__gt=pk)))[: size + 1])
    more, rows = len(rows) > size, rows[:size]
    rows.reverse()
    older = Cursor.of(rows[-1], OLDER).encode() if rows else None
    return KeysetPage(rows=rows, older=older, newer=Cursor.of(rows[0], NEWER).encode() if more else None)


@dataclass(frozen=True)
class BoundedCount:
    count: int  # exact when `exact`, else COUNT_LIMIT: there are more
    exact: bool

    def __str__(self) -> str:
        return f"{self.count:,}" if self.exact else f"more than {self.count:,}"


def bounded_count(queryset: QuerySet[M], *, limit: int | None = None) -> BoundedCount:
    """How many rows `queryset` has, counted up to `limit` (COUNT_LIMIT) only: `SELECT count(*) FROM (... LIMIT
    limit + 1)`."""
    limit = COUNT_LIMIT if limit is None else limit
    found = queryset.order_by().values("pk")[: limit + 1].count()
    return BoundedCount(count=min(found, limit), exact=found <= limit)
