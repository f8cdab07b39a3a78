"""Isolation matrix entries for the browser pages of the billing area (see tests/frontend/page_matrix.py)."""

from __future__ import annotations

from tests.isolation_rules import TENANT_ADMINS, Case, page_only

PAGES: dict[str, dict[str, Case]] = {
    # Spend as the API rules it: tenant admins (the outsider administers its own tenant, shown without a trace
    # of matrixco) and project managers; members of lower roles get 403.
    "billing/": {"GET": Case(page_only(200, ("manager", *TENANT_ADMINS)) | {"outsider": 200})},
    # Invoices are the tenant admins' (and portal admins'); everyone else is told they do not exist.
    # The efficiency report follows the spend's rules; a portal admin's default is every tenant's.
    "billing/efficiency/": {"GET": Case(page_only(200, ("manager", *TENANT_ADMINS)) | {"outsider": 200})},
    # The spend overview of one tenant or project: the billing page's rules (the outsider sees its own tenant).
    "billing/spend/": {"GET": Case(page_only(200, ("manager", *TENANT_ADMINS)) | {"outsider": 200})},
    "billing/invoices/<int:invoice_id>/": {"GET": Case(page_only(200, TENANT_ADMINS, denied=404))},
}
