"""The Django admin creates allocations through the quota services and shows the ledger read-only."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from quotas.models import Allocation, LedgerEntry
from tenants.models import AuditEvent
from tests.factories import grant_allocation, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _admin() -> Client:
    client = Client()
    client.force_login(make_user(is_staff=True))
    return client


def test_an_allocation_added_in_the_admin_gets_its_grant_row_and_audit_event() -> None:
    cluster = make_matrix_cluster()
    project = make_project(make_tenant())
    today = timezone.now().date()

    response = _admin().post(
        "/admin/quotas/allocation/add/",
        {
            "project": project.pk,
            "cluster": cluster.pk,
            "gpu_type": "h100",
            "gpu_hours": "12.5",
            "starts_on": today.isoformat(),
            "ends_on": today.isoformat(),
            "note": "pilot",
        },
    )

    assert response.status_code == 302
    allocation = Allocation.objects.get()
    assert (allocation.gpu_type, allocation.granted_gpu_seconds) == ("h100", 45000)
    assert list(LedgerEntry.objects.values_list("kind", "gpu_seconds", "note")) == [("grant", 45000, "pilot")]
    assert AuditEvent.objects.filter(action="allocation.create", target_id=str(allocation.pk)).exists()


def test_the_allocation_page_shows_balances_and_the_ledger() -> None:
    allocation = grant_allocation(make_project(make_tenant()), make_matrix_cluster(), "7.25")

    page = _admin().get(f"/admin/quotas/allocation/{allocation.pk}/change/").content.decode()

    assert "7.25" in page
    assert "initial grant" in page
