"""REST API routes of the jobs app (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
