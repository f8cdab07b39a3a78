"""Pagination of the API's lists: by page number (`?page=2&page_size=100`, at most 200 per page), or by cursor
for the lists that grow with the history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination, PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from portal.keyset import CursorInvalid, bounded_count, keyset_page


class PagePagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class KeysetPagination(BasePagination):
    """Cursor pages for lists that grow with the history (jobs): `?cursor=<next's>&page_size=100`.

    The answer keeps the page-number shape (`count`, `next`, `previous`, `results`) and adds `count_exact`:
    the count stops at portal.keyset.COUNT_LIMIT, so `count_exact: false` means "more than `count`". A page
    costs the same however deep; `page` is refused by name, as following it would repeat the first page.
    """

    page_size = PagePagination.page_size
    max_page_size = PagePagination.max_page_size

    def paginate_queryset(
        self, queryset: QuerySet[Any] | Sequence[Any], request: Request, view: Any = None
    ) -> list[Any]:
        assert isinstance(queryset, QuerySet), "keyset pages need a queryset ordered by created_at"
        if "page" in request.query_params:
            raise ValidationError(
                {"page": ["This list pages by cursor: follow `next` (or `previous`) instead of giving a page number."]}
            )
        size = self.page_size
        if "page_size" in request.query_params:
            size = PagePagination().get_page_size(request) or self.page_size
        try:
            self.page = keyset_page(queryset, cursor=request.query_params.get("cursor"), size=size)
        except CursorInvalid as error:
            raise ValidationError({"cursor": [str(error)]}) from None
        self.count = bounded_count(queryset)
        self.request = request
        return self.page.rows

    def _link(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        return replace_query_param(self.request.build_absolute_uri(), "cursor", cursor)

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {
                "count": self.count.count,
                "count_exact": self.count.exact,
                "next": self._link(self.page.older),
                "previous": self._link(self.page.newer),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["count", "count_exact", "results"],
            "properties": {
                "count": {"type": "integer", "example": 123, "description": "Exact up to 1,000; see count_exact"},
                "count_exact": {"type": "boolean", "description": "false: there are more than `count`"},
                "next": {**link, "example": "https://portal.example/api/v1/jobs/?cursor=bzE3NjQxNDg3MDc"},
                "previous": link,
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": "cursor",
                "required": False,
                "in": "query",
                "description": "Where the page starts: the cursor in the `next` or `previous` link",
                "schema": {"type": "string"},
            },
            {
                "name": "page_size",
                "required": False,
                "in": "query",
                "description": f"Rows per page (at most {self.max_page_size})",
                "schema": {"type": "integer"},
            },
        ]
