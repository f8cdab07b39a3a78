"""Memberships and POSIX users from the provider's directory, applied at each sign-in through the real demo
provider (tenants/directory.py, clusters/directory.py). People's groups are changed at the provider between
sign-ins (`DemoProvider.change_claims`), as a directory admin would change them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from clusters.models import ClusterAccount, DirectoryPosixUsername
from tenants.models import (
    AuditEvent,
    DirectoryGroupRole,
    Notification,
    ProjectMembership,
    Tenant,
    TenantMembership,
)
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user
from tests.oidc_provider import DemoProvider, refusal, sign_in, signed_in_username

pytestmark = pytest.mark.django_db

ORIGIN = "directory:demo"


@pytest.fixture
def directory(configure: Callable[..., Any]) -> dict[str, Any]:
    """The demo's mappings (as `seed_demo` makes them): acme-admins → admin of acme, acme-vision-members → member
    of acme/vision, globex-admins → admin of globex; preferred_username is the POSIX user on one cluster."""
    # Each tenant has an admin of its own, so that the directory's admins may come and go.
    acme, globex = make_tenant("acme", admin=make_user("ann")), make_tenant("globex", admin=make_user("gus"))
    vision = make_project(acme, "vision")
    cluster = make_matrix_cluster("north")
    for group, tenant, project, role in (
        ("acme-admins", "acme", "", "admin"),
        ("acme-vision-members", "acme", "vision", "member"),
        ("globex-admins", "globex", "", "admin"),
    ):
        DirectoryGroupRole.objects.create(
            provider="demo", group=group, tenant_slug=tenant, project_slug=project, role=role
        )
    DirectoryPosixUsername.objects.create(provider="demo", cluster=cluster, claim="preferred_username")
    return {"acme": acme, "globex": globex, "vision": vision, "cluster": cluster}


def roles_of(username: str) -> dict[str, tuple[str, str]]:
    """Where the user has a role: {"acme": ("admin", origin), "acme/vision": ("member", origin)}."""
    tenant_roles = {
        membership.tenant.slug: (membership.role, membership.origin)
        for membership in TenantMembership.objects.filter(user__username=username).select_related("tenant")
    }
    project_roles = {
        str(membership.project): (membership.role, membership.origin)
        for membership in ProjectMembership.objects.filter(user__username=username).select_related("project__tenant")
    }
    return tenant_roles | project_roles


def audited(*actions: str) -> list[tuple[str, str, Any]]:
    events = AuditEvent.objects.filter(action__in=actions).order_by("created_at", "id")
    return [(event.action, event.target_label, event.after) for event in events]


def test_a_newcomers_groups_make_her_a_member_and_her_username_her_posix_user(directory: dict[str, Any]) -> None:
    browser = Client()

    response = sign_in(browser, "dana")

    assert (response.status_code, response["Location"]) == (302, "/")
    assert signed_in_username(browser) == "dana"
    assert roles_of("dana") == {"acme": ("member", ORIGIN), "acme/vision": ("member", ORIGIN)}
    account = ClusterAccount.objects.get(user__username="dana")
    assert (account.cluster, account.username) == (directory["cluster"], "dana")
    assert audited("tenant_member.added", "project_member.added", "cluster_account.set")[-3:] == [
        (
            "tenant_member.added",
            "dana in acme as member",
            {"tenant": "acme", "user": "dana", "role": "member", "origin": ORIGIN},
        ),
        (
            "project_member.added",
            "dana in acme/vision as member",
            {"project": "acme/vision", "user": "dana", "role": "member", "origin": ORIGIN},
        ),
        ("cluster_account.set", "dana@north", {"cluster": "north", "user": "dana", "username": "dana"}),
    ]


def test_group_changes_take_effect_at_the_next_sign_in(directory: dict[str, Any], oidc_provider: DemoProvider) -> None:
    sign_in(Client(), "dana")

    oidc_provider.change_claims("dana", groups=["acme-admins", "acme-vision-members"])
    assert sign_in(Client(), "dana")["Location"] == "/"
    assert roles_of("dana") == {"acme": ("admin", ORIGIN), "acme/vision": ("member", ORIGIN)}

    oidc_provider.change_claims("dana", groups=["globex-admins"])
    assert sign_in(Client(), "dana")["Location"] == "/"
    assert roles_of("dana") == {"globex": ("admin", ORIGIN)}
    assert audited("tenant_member.role_changed", "project_member.removed", "tenant_member.removed") == [
        (
            "tenant_member.role_changed",
            "dana in acme as admin",
            {"tenant": "acme", "user": "dana", "role": "admin", "origin": ORIGIN},
        ),
        ("project_member.removed", "dana in acme/vision as member", None),
        ("tenant_member.removed", "dana in acme as admin", None),
    ]

    oidc_provider.change_claims("dana", groups=[])
    assert sign_in(Client(), "dana")["Location"] == "/"
    assert roles_of("dana") == {}


def test_roles_granted_by_hand_are_left_alone(directory: dict[str, Any], oidc_provider: DemoProvider) -> None:
    # bob's portal account, connected at his first sign-in; an admin made him manager of acme/vision by hand.
    bob = make_user("bob")
    add_project_member(directory["vision"], bob, role="manager")
    oidc_provider.change_claims("bob", groups=["acme-vision-members", "globex-admins"])

    assert sign_in(Client(), "bob")["Location"] == "/"
    assert roles_of("bob") == {"acme": ("member", ""), "acme/vision": ("manager", ""), "globex": ("admin", ORIGIN)}

    oidc_provider.change_claims("bob", groups=[])
    assert sign_in(Client(), "bob")["Location"] == "/"
    assert roles_of("bob") == {"acme": ("member", ""), "acme/vision": ("manager", "")}


def test_a_directory_tenant_role_stays_while_projects_granted_by_hand_need_it(
    directory: dict[str, Any], oidc_provider: DemoProvider
) -> None:
    sign_in(Client(), "dana")
    nlp = make_project(directory["acme"], "nlp")
    add_project_member(nlp, get_user_model().objects.get(username="dana"), role="viewer")

    oidc_provider.change_claims("dana", groups=[])
    sign_in(Client(), "dana")

    assert roles_of("dana") == {"acme": ("member", ORIGIN), "acme/nlp": ("viewer", "")}


# Conflicts ----------------------------------------------------------------------------------------------


def assert_conflict(browser: Client, response: Any, problem: str) -> None:
    assert response.status_code == 403
    assert refusal(response) == (
        f"{problem} Nobody was signed in and nothing was changed; the portal admins have been told."
    )
    assert signed_in_username(browser) is None
    notice = Notification.objects.get(kind="directory.conflict")
    assert notice.user.username == "root"
    assert notice.body == (
        f"{problem} Fix the group mappings or the portal (Django admin), then ask them to sign in again."
    )
    assert notice.link == "/admin/tenants/directorygrouprole/"


@pytest.fixture
def staff() -> Any:
    return make_user("root", is_staff=True)


def test_a_group_naming_an_unknown_tenant_makes_no_account(directory: dict[str, Any], staff: Any) -> None:
    DirectoryGroupRole.objects.create(
        provider="demo", group="acme-vision-members", tenant_slug="initech", project_slug="", role="member"
    )
    browser = Client()

    response = sign_in(browser, "dana")

    assert_conflict(
        browser,
        response,
        "Your groups at Demo identity provider give you a role in the tenant 'initech', which this portal does not "
        "have.",
    )
    assert not get_user_model().objects.filter(username="dana").exists()
    assert not TenantMembership.objects.filter(user__username="dana").exists()
    assert not ClusterAccount.objects.exists()
    assert not AuditEvent.objects.filter(target_label__contains="dana").exists()
    assert Notification.objects.get().title == (
        "Sign-in of 'dana' through Demo identity provider refused: the directory does not fit the portal"
    )


def test_a_group_naming_an_unknown_project_is_refused(directory: dict[str, Any], staff: Any) -> None:
    DirectoryGroupRole.objects.create(
        provider="demo", group="acme-vision-members", tenant_slug="acme", project_slug="robotics", role="viewer"
    )
    browser = Client()

    assert_conflict(
        browser,
        sign_in(browser, "dana"),
        "Your groups at Demo identity provider give you a role in the project 'acme/robotics', which this portal "
        "does not have.",
    )
    assert not get_user_model().objects.filter(username="dana").exists()


def test_a_posix_name_taken_by_someone_else_is_refused(directory: dict[str, Any], staff: Any) -> None:
    ClusterAccount.objects.create(cluster=directory["cluster"], user=make_user("erin"), username="dana")
    browser = Client()

    assert_conflict(
        browser,
        sign_in(browser, "dana"),
        "Your POSIX user name 'dana' on cluster 'north' already belongs to another portal account ('erin').",
    )
    assert not get_user_model().objects.filter(username="dana").exists()
    assert not TenantMembership.objects.filter(user__username="dana").exists()


def test_a_missing_claim_changes_nothing_for_someone_known(
    directory: dict[str, Any], staff: Any, oidc_provider: DemoProvider
) -> None:
    sign_in(Client(), "dana")
    before = roles_of("dana")
    oidc_provider.change_claims("dana", groups=None)
    browser = Client()

    assert_conflict(
        browser,
        sign_in(browser, "dana"),
        "Demo identity provider did not send your groups (the 'groups' claim), which this portal needs to know your "
        "tenants and projects.",
    )
    assert roles_of("dana") == before


def test_a_missing_posix_claim_is_refused(directory: dict[str, Any], staff: Any) -> None:
    DirectoryPosixUsername.objects.update(claim="uid")
    browser = Client()

    assert_conflict(
        browser,
        sign_in(browser, "dana"),
        "Demo identity provider did not send your POSIX user name (the 'uid' claim), which this portal needs to run "
        "your jobs on cluster 'north'.",
    )
    assert not get_user_model().objects.filter(username="dana").exists()
    assert not Tenant.objects.filter(memberships__user__username="dana").exists()


def test_another_providers_mappings_do_not_apply(configure: Callable[..., Any], directory: dict[str, Any]) -> None:
    DirectoryGroupRole.objects.update(provider="company")

    assert sign_in(Client(), "dana")["Location"] == "/"

    assert roles_of("dana") == {}


def test_a_removal_a_rule_forbids_is_refused_and_changes_nothing(
    directory: dict[str, Any], staff: Any, oidc_provider: DemoProvider
) -> None:
    from tenants.services import tenant_member_remove

    oidc_provider.change_claims("dana", groups=["globex-admins"])
    sign_in(Client(), "dana")
    tenant_member_remove(actor=None, membership=TenantMembership.objects.get(user__username="gus"))
    oidc_provider.change_claims("dana", groups=[])
    browser = Client()

    assert_conflict(
        browser,
        sign_in(browser, "dana"),
        "'dana' is the last admin of tenant 'globex'; make another member an admin before removing them.",
    )
    assert roles_of("dana") == {"globex": ("admin", ORIGIN)}
