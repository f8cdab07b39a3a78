"""`visible_project_ids` (one prepared statement, where every list of jobs starts) answers what `visible_to`, the
one rule for project data, answers: for a member, a manager, a tenant admin, someone in both, an outsider, a portal
admin and an anonymous visitor."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from tenants.models import Project, ProjectRole, TenantRole
from tenants.selectors import AnyUser, visible_project_ids, visible_to
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _by_rule(user: AnyUser) -> set[int]:
    return set(visible_to(Project.objects.all(), user=user, project_field="").values_list("pk", flat=True))


def test_the_prepared_ids_follow_the_rule_for_everyone() -> None:
    north, south = make_tenant(), make_tenant()
    north_a, north_b, south_a = make_project(north), make_project(north), make_project(south)
    member, manager, admin, both, outsider = (make_user() for _ in range(5))
    for tenant, person in ((north, member), (north, manager), (south, both)):
        add_tenant_member(tenant, person)
    add_project_member(north_a, member)
    add_project_member(north_b, manager, role=ProjectRole.MANAGER)
    add_tenant_member(north, admin, role=TenantRole.ADMIN)
    add_tenant_member(north, both, role=TenantRole.ADMIN)
    add_project_member(south_a, both)
    portal_admin = make_user(is_staff=True)

    expected: dict[AnyUser, set[int]] = {
        member: {north_a.pk},
        manager: {north_b.pk},
        admin: {north_a.pk, north_b.pk},
        both: {north_a.pk, north_b.pk, south_a.pk},
        outsider: set(),
        portal_admin: {north_a.pk, north_b.pk, south_a.pk},
        AnonymousUser(): set(),
    }
    for viewer, projects in expected.items():
        ids = visible_project_ids(user=viewer)
        assert set(ids) == projects == _by_rule(viewer), viewer
        assert len(ids) == len(set(ids)), "each project once"
