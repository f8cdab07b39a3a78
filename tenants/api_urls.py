"""REST API routes for tenants, projects, members, tokens and the audit log (under /api/v1/)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
