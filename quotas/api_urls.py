"""Routes of the quota API, included under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from quotas.apis import AllocationDetailApi, AllocationGrantApi, AllocationLedgerApi, AllocationListApi

urlpatterns: list[URLPattern] = [
    path("allocations/", AllocationListApi.as_view(), name="api-allocations"),
    path("allocations/<int:allocation_id>/", AllocationDetailApi.as_view(), name="api-allocation"),
    path("allocations/<int:allocation_id>/grant/", AllocationGrantApi.as_view(), name="api-allocation-grant"),
    path("allocations/<int:allocation_id>/ledger/", AllocationLedgerApi.as_view(), name="api-allocation-ledger"),
]
