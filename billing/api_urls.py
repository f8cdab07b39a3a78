"""Routes of the rates and invoices API, included under /api/v1/."""

from __future__ import annotations

from django.urls import URLPattern, path

from billing.apis import (
    InvoiceCsvApi,
    InvoiceDetailApi,
    InvoiceFinaliseApi,
    InvoiceListApi,
    RateDetailApi,
    RateListApi,
)

urlpatterns: list[URLPattern] = [
    path("rates/", RateListApi.as_view(), name="api-rates"),
    path("rates/<int:rate_id>/", RateDetailApi.as_view(), name="api-rate"),
    path("invoices/", InvoiceListApi.as_view(), name="api-invoices"),
    path("invoices/<int:invoice_id>/", InvoiceDetailApi.as_view(), name="api-invoice"),
    path("invoices/<int:invoice_id>/csv/", InvoiceCsvApi.as_view(), name="api-invoice-csv"),
    path("invoices/<int:invoice_id>/finalise/", InvoiceFinaliseApi.as_view(), name="api-invoice-finalise"),
]
