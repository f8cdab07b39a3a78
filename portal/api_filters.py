"""Query-string filters shared by the API's filter sets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField


class UtcIsoDateTimeField(IsoDateTimeField):  # type: ignore[misc]
    """An ISO 8601 date-time, turned into UTC before it reaches a query.

    Python accepts offsets up to 23:59 but PostgreSQL only up to 15:59, so `+16:00` passed on as given
    made the database refuse the query (a 500); a moment too close to year 1 to exist in UTC is refused here.
    """

    def to_python(self, value: Any) -> datetime | None:
        parsed: datetime | None = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError(
                "This moment is out of range; give a date-time between years 1 and 9999, e.g. 2026-11-01T00:00:00Z.",
                code="invalid",
            ) from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):  # type: ignore[misc]
    field_class = UtcIsoDateTimeField
