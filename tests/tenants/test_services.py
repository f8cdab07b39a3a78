"""Rules the tenant services keep whoever calls them: names, last admins under concurrency, audit rows."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from tenants import services
from tenants.models import AuditEvent, TenantMembership, TenantRole
from tenants.slurm_names import MAX_ACCOUNT_NAME_LENGTH, project_account_name, tenant_parent_account_name
from tests.factories import add_tenant_member, make_tenant, make_user


def test_slurm_names_are_readable_when_short() -> None:
    assert tenant_parent_account_name("acme") == "t_acme"
    assert project_account_name("acme", "vision") == "acme_vision"


def test_long_slurm_names_are_cut_to_the_limit_and_stay_distinct() -> None:
    long_tenant = "a" + "b" * 39
    first = project_account_name(long_tenant, "project-one-with-a-long-name")
    second = project_account_name(long_tenant, "project-two-with-a-long-name")
    assert len(first) == len(second) == MAX_ACCOUNT_NAME_LENGTH
    assert first != second
    assert first == project_account_name(long_tenant, "project-one-with-a-long-name")  # stable
    assert len(tenant_parent_account_name(long_tenant)) == MAX_ACCOUNT_NAME_LENGTH


def test_tenant_parents_and_project_accounts_never_collide() -> None:
    # A project account starts with its tenant's slug, which is at least two characters and has no
    # underscore, so it can never start with the parents' "t_".
    assert project_account_name("tx", "acme") == "tx_acme"
    assert tenant_parent_account_name("acme") == "t_acme"
    assert not project_account_name("tb", "acme").startswith("t_")


@pytest.mark.django_db
def test_a_change_that_changes_nothing_writes_no_audit_event() -> None:
    tenant = make_tenant("steady")
    before = AuditEvent.objects.count()
    services.tenant_update(actor=None, tenant=tenant, name="Test tenant")
    assert AuditEvent.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin() -> None:
    first, second = make_user("first-admin"), make_user("second-admin")
    tenant = make_tenant("racing", admin=first)
    add_tenant_member(tenant, second, role=TenantRole.ADMIN)
    memberships = list(TenantMembership.objects.filter(tenant=tenant).select_related("tenant", "user"))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def demote(membership: TenantMembership) -> None:
        barrier.wait()
        try:
            services.tenant_member_change_role(actor=None, membership=membership, role=TenantRole.MEMBER)
            outcomes.append("demoted")
        except ValidationError:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(membership,)) for membership in memberships]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["demoted", "refused"]
    assert TenantMembership.objects.filter(tenant=tenant, role=TenantRole.ADMIN).count() == 1
