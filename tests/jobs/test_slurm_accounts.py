"""Projects' Slurm accounts and user associations, synced and reconciled against the real local cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client

from clusters.accounts import cluster_slurm_reconcile, project_slurm_sync
from clusters.models import Cluster, ClusterAccount, ProjectSlurmAccount, SlurmDriftReport
from clusters.slurm import SlurmClient, SlurmError, SlurmUnavailable
from clusters.slurm.types import AssociationInfo, JobSubmission
from clusters.tasks import cluster_slurm_reconcile as cluster_slurm_reconcile_task
from tenants import services
from tenants.models import Project, ProjectMembership, Tenant
from tests.conftest import wait_until
from tests.factories import add_project_member, add_tenant_member, make_project, make_tenant, make_user, unique_slug

NO_USERNAME_NOTE = "{} has no username on cluster local; a portal admin sets it under Cluster accounts."


# Fixtures and helpers -----------------------------------------------------------------------------------


def _make_cluster(name: str = "local", url: str = settings.LOCAL_CLUSTER_URL) -> Cluster:
    return Cluster.objects.create(
        name=name,
        slurmrestd_url=url,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
    )


@pytest.fixture
def slurm_accounts_to_remove(slurm_client: SlurmClient) -> Iterator[list[str]]:
    """Names of Slurm accounts a test created; removed afterwards, projects' accounts before tenants' parents."""
    names: list[str] = []
    yield names
    for name in sorted(dict.fromkeys(names), key=lambda account: account.startswith("t_")):
        _delete_account(slurm_client, name)


def _delete_account(client: SlurmClient, name: str) -> None:
    # slurmdbd refuses to delete an account while a cancelled job is still completing: retry briefly.
    for _ in range(40):
        try:
            client.delete_account(name=name)
            return
        except SlurmError as exc:
            if any(message.error_number == 1900 for message in exc.messages):
                return  # 22.05's answer for an account that does not exist (any more)
            time.sleep(0.5)


def _associations(client: SlurmClient, account: str) -> list[AssociationInfo]:
    try:
        return client.associations(account=account, cluster="local")
    except SlurmError as exc:
        if any(message.error_number == 9003 for message in exc.messages):
            return []  # 22.05 answers "Nothing found" with an error, not an empty list
        raise


def users_of(client: SlurmClient, account: str) -> set[str]:
    return {association.user for association in _associations(client, account) if association.user}


def parent_of(client: SlurmClient, account: str) -> str | None:
    """The account's parent on the local cluster; None when the account has no association there."""
    own = [association for association in _associations(client, account) if not association.user]
    return own[0].parent_account if own else None


def _in_accounting(client: SlurmClient, job_id: int) -> bool:
    try:
        client.accounting_job(job_id=job_id)
    except SlurmError:
        return False
    return True


@dataclass
class World:
    cluster: Cluster
    tenant: Tenant
    project: Project
    alice: Any
    bob: Any

    @property
    def account(self) -> str:
        return self.project.slurm_account

    @property
    def parent(self) -> str:
        return self.tenant.slurm_parent_account

    def row(self) -> ProjectSlurmAccount:
        return ProjectSlurmAccount.objects.get(project=self.project, cluster=self.cluster)


@pytest.fixture
def world(slurm_accounts_to_remove: list[str]) -> World:
    """A tenant with project `vision` and alice as a member; alice and bob have usernames on `local`."""
    cluster = _make_cluster()
    alice, bob = make_user("alice"), make_user("bob")
    ClusterAccount.objects.create(cluster=cluster, user=alice, username="alice")
    ClusterAccount.objects.create(cluster=cluster, user=bob, username="bob")
    tenant = make_tenant(unique_slug("sa"))
    project = make_project(tenant, "vision")
    slurm_accounts_to_remove.extend([project.slurm_account, tenant.slurm_parent_account])
    add_project_member(project, alice, "member")
    add_tenant_member(tenant, bob)
    return World(cluster=cluster, tenant=tenant, project=project, alice=alice, bob=bob)


def _membership(world: World, user: Any) -> ProjectMembership:
    return ProjectMembership.objects.get(project=world.project, user=user)


# Syncing a project --------------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_sync_creates_the_tenant_parent_and_project_accounts_with_the_members_associations(
    world: World, slurm_client: SlurmClient
) -> None:
    project_slurm_sync(project_id=world.project.pk)

    assert parent_of(slurm_client, world.parent) == "root"
    assert parent_of(slurm_client, world.account) == world.parent
    assert users_of(slurm_client, world.account) == {"alice"}
    assert users_of(slurm_client, world.parent) == set()
    accounts = {account.name: account for account in slurm_client.accounts()}
    assert (accounts[world.account].description, accounts[world.account].organization) == (
        "Test project",
        world.tenant.slug,
    )
    row = world.row()
    assert (row.state, row.last_error) == ("ready", "")
    assert row.synced_at is not None


@pytest.mark.cluster
@pytest.mark.django_db
def test_membership_changes_follow_into_slurm(world: World, slurm_client: SlurmClient) -> None:
    project_slurm_sync(project_id=world.project.pk)

    services.project_member_add(actor=None, project=world.project, user=world.bob, role="member")
    project_slurm_sync(project_id=world.project.pk)
    assert users_of(slurm_client, world.account) == {"alice", "bob"}

    services.project_member_change_role(actor=None, membership=_membership(world, world.bob), role="viewer")
    project_slurm_sync(project_id=world.project.pk)
    assert users_of(slurm_client, world.account) == {"alice"}

    services.project_member_remove(actor=None, membership=_membership(world, world.alice))
    project_slurm_sync(project_id=world.project.pk)
    assert users_of(slurm_client, world.account) == set()
    assert parent_of(slurm_client, world.account) == world.parent
    assert (world.row().state, world.row().last_error) == ("ready", "")


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_manager_is_associated_and_a_viewer_is_not(world: World, slurm_client: SlurmClient) -> None:
    viewer = make_user("vera")
    ClusterAccount.objects.create(cluster=world.cluster, user=viewer, username="carol")
    add_project_member(world.project, viewer, "viewer")
    services.project_member_add(actor=None, project=world.project, user=world.bob, role="manager")

    project_slurm_sync(project_id=world.project.pk)

    assert users_of(slurm_client, world.account) == {"alice", "bob"}


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_member_without_a_username_on_the_cluster_is_named_and_the_others_are_synced(
    world: World, slurm_client: SlurmClient
) -> None:
    add_project_member(world.project, make_user("dora"), "member")
    add_project_member(world.project, make_user("carl"), "manager")

    project_slurm_sync(project_id=world.project.pk)

    assert users_of(slurm_client, world.account) == {"alice"}
    row = world.row()
    assert row.state == "ready"
    assert row.last_error == f"{NO_USERNAME_NOTE.format('carl')}\n{NO_USERNAME_NOTE.format('dora')}"


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_deactivated_user_loses_their_association(world: World, slurm_client: SlurmClient) -> None:
    project_slurm_sync(project_id=world.project.pk)
    get_user_model().objects.filter(pk=world.alice.pk).update(is_active=False)

    project_slurm_sync(project_id=world.project.pk)

    assert users_of(slurm_client, world.account) == set()


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_user_leaves_the_project_that_is_their_default_account_while_keeping_another(
    world: World, slurm_client: SlurmClient, slurm_accounts_to_remove: list[str]
) -> None:
    # A username Slurm has never seen (slurmdbd does not check POSIX users): its first association, on
    # `vision`, is its default account. ColdFront #274 saw removing the default refused; 22.05.8 removes it.
    newcomer = make_user("nina")
    slurm_username = unique_slug("u")
    ClusterAccount.objects.create(cluster=world.cluster, user=newcomer, username=slurm_username)
    add_project_member(world.project, newcomer, "member")
    project_slurm_sync(project_id=world.project.pk)
    other = make_project(world.tenant, "nlp")
    slurm_accounts_to_remove.append(other.slurm_account)
    add_project_member(other, newcomer, "member")
    project_slurm_sync(project_id=other.pk)

    services.project_member_remove(actor=None, membership=_membership(world, newcomer))
    project_slurm_sync(project_id=world.project.pk)

    assert users_of(slurm_client, world.account) == {"alice"}
    assert users_of(slurm_client, other.slurm_account) == {slurm_username}
    assert [association.account for association in slurm_client.associations(user=slurm_username)] == [
        other.slurm_account
    ]
    assert (world.row().state, world.row().last_error) == ("ready", "")


@pytest.mark.cluster
@pytest.mark.django_db
def test_removing_a_member_with_a_running_job_waits_for_the_job_then_the_reconcile_removes_them(
    world: World, slurm_client: SlurmClient
) -> None:
    services.project_member_add(actor=None, project=world.project, user=world.bob, role="member")
    project_slurm_sync(project_id=world.project.pk)
    submission = JobSubmission(
        name="pytest-slurm-accounts",
        account=world.account,
        partition="debug",
        script="#!/bin/bash\nsleep 120\n",
        time_limit_minutes=5,
        working_directory="/tmp",
        standard_output="/dev/null",
        standard_error="/dev/null",
    )
    job_id = slurm_client.submit_job(user="bob", submission=submission).job_id
    try:
        # slurmdbd refuses the removal only once slurmctld has told it about the job.
        wait_until(lambda: _in_accounting(slurm_client, job_id), what="the job's accounting record")
        services.project_member_change_role(actor=None, membership=_membership(world, world.bob), role="viewer")
        project_slurm_sync(project_id=world.project.pk)

        assert users_of(slurm_client, world.account) == {"alice", "bob"}
        row = world.row()
        assert row.state == "pending"
        assert row.last_error == (
            f"bob holds an association with {world.account} on cluster local, but no manager or member of "
            f"{world.tenant.slug}/vision has that username there. Not repaired yet: Slurm refuses while jobs are "
            f"running or pending in {world.account} ('Job(s) active, cancel job(s) before remove'); the next "
            "reconcile tries again."
        )
    finally:
        slurm_client.cancel_job(user=slurm_client.admin_user, job_id=job_id)

    # slurmdbd learns of the job's end a moment after slurmctld: reconcile until the removal goes through.
    reports: list[SlurmDriftReport] = []

    def removed() -> bool:
        reports.append(cluster_slurm_reconcile(cluster_id=world.cluster.pk))
        return users_of(slurm_client, world.account) == {"alice"}

    wait_until(removed, timeout_seconds=30, what="the reconcile's removal of bob's association")
    assert reports[-1].findings == [
        {
            "kind": "extra_user_association",
            "account": world.account,
            "user": "bob",
            "detail": f"bob holds an association with {world.account} on cluster local, but no manager or member "
            f"of {world.tenant.slug}/vision has that username there.",
            "repaired": True,
        }
    ]
    assert (world.row().state, world.row().last_error) == ("ready", "")


@pytest.mark.django_db
def test_the_sync_of_a_project_that_no_longer_exists_does_nothing() -> None:
    _make_cluster()

    project_slurm_sync(project_id=2_000_000_000)

    assert ProjectSlurmAccount.objects.count() == 0


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_cluster_that_is_down_does_not_hold_up_the_others_and_the_error_is_raised_for_a_retry(
    world: World, slurm_client: SlurmClient
) -> None:
    offline = _make_cluster("offline", url="http://127.0.0.1:9")  # the discard port: nothing listens

    with pytest.raises(SlurmUnavailable):
        project_slurm_sync(project_id=world.project.pk)

    assert users_of(slurm_client, world.account) == {"alice"}
    assert (world.row().state, world.row().last_error) == ("ready", "")
    down = ProjectSlurmAccount.objects.get(project=world.project, cluster=offline)
    assert down.state == "pending"
    assert down.last_error.startswith("Slurm on cluster offline did not answer: slurmrestd at http://127.0.0.1:9 is ")
    assert down.last_error.endswith(". The sync will be retried.")
    assert down.synced_at is None


# Through the real worker --------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_creates_the_accounts_of_a_new_project_and_its_member(
    celery_worker: str, slurm_client: SlurmClient, slurm_accounts_to_remove: list[str]
) -> None:
    cluster = _make_cluster()
    alice = make_user("alice")
    ClusterAccount.objects.create(cluster=cluster, user=alice, username="alice")
    tenant = make_tenant(unique_slug("sw"))
    project = make_project(tenant, "vision")  # each of these schedules project_slurm_sync once committed
    slurm_accounts_to_remove.extend([project.slurm_account, tenant.slurm_parent_account])
    add_project_member(project, alice, "manager")

    def synced() -> bool:
        ready = ProjectSlurmAccount.objects.filter(project=project, cluster=cluster, state="ready").exists()
        return ready and users_of(slurm_client, project.slurm_account) == {"alice"}

    try:
        wait_until(synced, what="the worker's sync of the new project")
        assert parent_of(slurm_client, tenant.slurm_parent_account) == "root"
        assert parent_of(slurm_client, project.slurm_account) == tenant.slurm_parent_account
    finally:
        # A sync still queued must not recreate the accounts after they are removed: once the project is
        # gone, it does nothing. Deleting its rows waits for a sync that holds one.
        with transaction.atomic():
            ProjectSlurmAccount.objects.filter(project=project).delete()
            project.delete()


# Reconciling a cluster ----------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_reconcile_restores_an_association_removed_behind_the_portals_back(
    world: World, slurm_client: SlurmClient
) -> None:
    project_slurm_sync(project_id=world.project.pk)
    slurm_client.remove_user_association(account=world.account, user="alice", cluster="local")

    report = cluster_slurm_reconcile(cluster_id=world.cluster.pk)

    assert report.findings == [
        {
            "kind": "missing_user_association",
            "account": world.account,
            "user": "alice",
            "detail": f"alice is a manager or member of {world.tenant.slug}/vision but has no association with "
            f"{world.account} on cluster local.",
            "repaired": True,
        }
    ]
    assert report.error == ""
    assert report.finished_at is not None
    assert users_of(slurm_client, world.account) == {"alice"}
    assert world.row().state == "ready"


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_reconcile_removes_and_reports_an_association_added_behind_the_portals_back(
    world: World, slurm_client: SlurmClient
) -> None:
    project_slurm_sync(project_id=world.project.pk)
    slurm_client.add_user_association(account=world.account, user="bob", cluster="local")
    slurm_client.add_user_association(account=world.parent, user="carol", cluster="local")

    report = cluster_slurm_reconcile(cluster_id=world.cluster.pk)

    assert report.findings == [
        {
            "kind": "extra_user_association",
            "account": world.parent,
            "user": "carol",
            "detail": f"carol holds an association with tenant parent account {world.parent} on cluster local; "
            "the portal grants associations on project accounts only.",
            "repaired": True,
        },
        {
            "kind": "extra_user_association",
            "account": world.account,
            "user": "bob",
            "detail": f"bob holds an association with {world.account} on cluster local, but no manager or member "
            f"of {world.tenant.slug}/vision has that username there.",
            "repaired": True,
        },
    ]
    assert users_of(slurm_client, world.account) == {"alice"}
    assert users_of(slurm_client, world.parent) == set()


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_reconcile_reports_unknown_accounts_in_a_tenants_subtree_and_leaves_them(
    world: World, slurm_client: SlurmClient, slurm_accounts_to_remove: list[str]
) -> None:
    project_slurm_sync(project_id=world.project.pk)
    stray, nested = f"{world.tenant.slug}_stray", f"{world.tenant.slug}_nested"
    slurm_accounts_to_remove.extend([nested, stray])
    for name, parent in ((stray, world.parent), (nested, world.account)):
        slurm_client.create_account(
            name=name, cluster="local", description="made by hand", organization="ops", parent_account=parent
        )

    report = cluster_slurm_reconcile(cluster_id=world.cluster.pk)

    left_in_place = "Left in place: the portal deletes no account it did not create; a Slurm admin removes it"
    assert report.findings == [
        {
            "kind": "unknown_account",
            "account": nested,
            "user": "",
            "detail": f"{nested} is under project account {world.account} on cluster local, but no portal project "
            f"uses it. {left_in_place} (sacctmgr delete account {nested}) if nobody needs it.",
            "repaired": False,
        },
        {
            "kind": "unknown_account",
            "account": stray,
            "user": "",
            "detail": f"{stray} is under tenant parent account {world.parent} on cluster local, but no portal "
            f"project uses it. {left_in_place} (sacctmgr delete account {stray}) if nobody needs it.",
            "repaired": False,
        },
    ]
    assert parent_of(slurm_client, stray) == world.parent
    assert parent_of(slurm_client, nested) == world.account
    assert report.unrepaired_count == 2


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_reconcile_recreates_missing_accounts_and_moves_one_under_the_wrong_parent_back(
    world: World, slurm_client: SlurmClient, slurm_accounts_to_remove: list[str]
) -> None:
    other = make_project(world.tenant, "nlp")
    slurm_accounts_to_remove.append(other.slurm_account)
    project_slurm_sync(project_id=world.project.pk)
    project_slurm_sync(project_id=other.pk)
    # Behind the portal's back: `vision` is deleted along with the tenant's parent; `nlp` survives, moved
    # under root first (creating an existing account moves it).
    slurm_client.create_account(
        name=other.slurm_account, cluster="local", description="x", organization="x", parent_account="root"
    )
    _delete_account(slurm_client, world.account)
    _delete_account(slurm_client, world.parent)
    assert parent_of(slurm_client, world.parent) is None

    report = cluster_slurm_reconcile(cluster_id=world.cluster.pk)

    tenant, parent, account = world.tenant.slug, world.parent, world.account
    assert report.findings == [
        {
            "kind": "missing_parent_account",
            "account": parent,
            "user": "",
            "detail": f"Tenant {tenant}'s parent account {parent} does not exist on cluster local.",
            "repaired": True,
        },
        {
            "kind": "missing_project_account",
            "account": account,
            "user": "",
            "detail": f"Project {tenant}/vision's account {account} does not exist on cluster local.",
            "repaired": True,
        },
        {
            "kind": "missing_user_association",
            "account": account,
            "user": "alice",
            "detail": f"alice is a manager or member of {tenant}/vision but has no association with {account} "
            "on cluster local.",
            "repaired": True,
        },
        {
            "kind": "wrong_parent",
            "account": other.slurm_account,
            "user": "",
            "detail": f"Project {tenant}/nlp's account {other.slurm_account} is under root, not under {parent}.",
            "repaired": True,
        },
    ]
    assert parent_of(slurm_client, parent) == "root"
    assert parent_of(slurm_client, account) == parent
    assert parent_of(slurm_client, other.slurm_account) == parent
    assert users_of(slurm_client, account) == {"alice"}


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_reconcile_that_finds_everything_in_line_reports_nothing(world: World, slurm_client: SlurmClient) -> None:
    add_project_member(world.project, make_user("dora"), "member")
    project_slurm_sync(project_id=world.project.pk)

    report = cluster_slurm_reconcile(cluster_id=world.cluster.pk)

    assert (report.findings, report.error) == ([], "")
    assert (world.row().state, world.row().last_error) == ("ready", NO_USERNAME_NOTE.format("dora"))


@pytest.mark.django_db
def test_a_reconcile_of_an_unreachable_cluster_records_why_it_stopped() -> None:
    cluster = _make_cluster("offline", url="http://127.0.0.1:9")

    report = cluster_slurm_reconcile(cluster_id=cluster.pk)

    assert report.findings == []
    assert report.error.startswith("The run stopped early: Slurm on cluster offline failed: slurmrestd at ")
    assert report.finished_at is not None


@pytest.mark.django_db
def test_the_reconcile_task_skips_an_inactive_cluster() -> None:
    cluster = _make_cluster()
    Cluster.objects.filter(pk=cluster.pk).update(is_active=False)

    cluster_slurm_reconcile_task(cluster.pk)

    assert SlurmDriftReport.objects.count() == 0


# REST API -----------------------------------------------------------------------------------------------

SYNCED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def acme() -> dict[str, Any]:
    """Tenant acme, project vision with a viewer; its account recorded on `local`, nothing yet on `remote`."""
    local, remote = _make_cluster(), _make_cluster("remote", url="http://127.0.0.1:6821")
    tenant = make_tenant("acme")
    project = make_project(tenant, "vision")
    viewer, outsider, staff = make_user("vera"), make_user("olga"), make_user("sam", is_staff=True)
    add_project_member(project, viewer, "viewer")
    ProjectSlurmAccount.objects.create(
        project=project, cluster=local, state="ready", last_error=NO_USERNAME_NOTE.format("dora"), synced_at=SYNCED_AT
    )
    return {"local": local, "remote": remote, "viewer": viewer, "outsider": outsider, "staff": staff}


def _get(user: Any, url: str) -> Any:
    client = Client()
    client.force_login(user)
    return client.get(url)


@pytest.mark.django_db
def test_project_viewers_read_the_projects_account_on_each_cluster(acme: dict[str, Any]) -> None:
    response = _get(acme["viewer"], "/api/v1/tenants/acme/projects/vision/slurm-accounts/")

    assert response.status_code == 200
    assert response.json() == {
        "count": 2,
        "next": None,
        "previous": None,
        "results": [
            {
                "cluster": "local",
                "account": "acme_vision",
                "state": "ready",
                "last_error": NO_USERNAME_NOTE.format("dora"),
                "synced_at": "2026-01-02T03:04:05Z",
            },
            {"cluster": "remote", "account": "acme_vision", "state": "pending", "last_error": "", "synced_at": None},
        ],
    }


@pytest.mark.django_db
def test_outsiders_cannot_tell_whether_the_project_exists(acme: dict[str, Any]) -> None:
    response = _get(acme["outsider"], "/api/v1/tenants/acme/projects/vision/slurm-accounts/")

    assert response.status_code == 404
    assert response.json() == {
        "code": "not_found",
        "message": "No project 'acme/vision' exists among the ones you can see; check the name or ask for access.",
        "fields": {},
    }


@pytest.mark.django_db
def test_portal_admins_list_drift_reports_newest_first_and_by_cluster(acme: dict[str, Any]) -> None:
    finding = {"kind": "unknown_account", "account": "acme_x", "user": "", "detail": "left", "repaired": False}
    SlurmDriftReport.objects.create(cluster=acme["local"], started_at=SYNCED_AT, finished_at=SYNCED_AT)
    newer = SlurmDriftReport.objects.create(
        cluster=acme["local"], started_at=datetime(2026, 1, 3, tzinfo=UTC), finished_at=None, findings=[finding]
    )
    SlurmDriftReport.objects.create(cluster=acme["remote"], started_at=SYNCED_AT, error="down")

    everything = _get(acme["staff"], "/api/v1/slurm-drift-reports/").json()
    local = _get(acme["staff"], "/api/v1/slurm-drift-reports/?cluster=local").json()

    # Newest first; of two runs started at the same moment, the later-recorded one first.
    assert [(report["cluster"], report["started_at"]) for report in everything["results"]] == [
        ("local", "2026-01-03T00:00:00Z"),
        ("remote", "2026-01-02T03:04:05Z"),
        ("local", "2026-01-02T03:04:05Z"),
    ]
    assert local["count"] == 2
    assert local["results"][0] == {
        "id": newer.pk,
        "cluster": "local",
        "started_at": "2026-01-03T00:00:00Z",
        "finished_at": None,
        "error": "",
        "findings": [finding],
    }


@pytest.mark.django_db
def test_drift_reports_need_a_portal_admin(acme: dict[str, Any]) -> None:
    SlurmDriftReport.objects.create(cluster=acme["local"], started_at=SYNCED_AT)

    response = _get(acme["viewer"], "/api/v1/slurm-drift-reports/")

    assert response.status_code == 403
    assert response.json() == {
        "code": "permission_denied",
        "message": "Slurm drift reports need a portal admin; ask one of the portal's admins.",
        "fields": {},
    }


def test_the_schema_documents_both_endpoints_with_their_response_shapes(client: Client, db: None) -> None:
    schema = client.get("/api/schema/?format=json").json()

    accounts = schema["paths"]["/api/v1/tenants/{tenant}/projects/{project}/slurm-accounts/"]["get"]
    reports = schema["paths"]["/api/v1/slurm-drift-reports/"]["get"]
    assert accounts["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PaginatedProjectSlurmAccountList"
    }
    assert reports["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PaginatedSlurmDriftReportList"
    }
    assert "cluster" in [parameter["name"] for parameter in reports["parameters"]]
    fields = schema["components"]["schemas"]["ProjectSlurmAccount"]["properties"]
    assert sorted(fields) == ["account", "cluster", "last_error", "state", "synced_at"]


# Admin --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_reconcile_action_queues_a_run_per_active_cluster_after_commit(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    cluster = _make_cluster()

    with django_capture_on_commit_callbacks() as callbacks:
        response = admin_client.post(
            "/admin/clusters/cluster/",
            {"action": "reconcile_slurm_accounts_now", "_selected_action": [cluster.pk]},
            follow=True,
        )

    assert response.status_code == 200
    assert (
        "Asked the workers to reconcile the Slurm accounts of 1 active cluster(s); "
        "the result appears under Slurm drift reports."
    ) in response.content.decode()
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_admins_read_drift_reports_and_account_states_but_cannot_change_them(admin_client: Client) -> None:
    cluster = _make_cluster()
    project = make_project(make_tenant("acme"), "vision")
    ProjectSlurmAccount.objects.create(project=project, cluster=cluster, state="error", last_error="Slurm refused")
    report = SlurmDriftReport.objects.create(
        cluster=cluster,
        started_at=SYNCED_AT,
        finished_at=SYNCED_AT,
        findings=[
            {"kind": "unknown_account", "account": "acme_old", "user": "", "detail": "Left <b>", "repaired": False}
        ],
    )

    detail = admin_client.get(f"/admin/clusters/slurmdriftreport/{report.pk}/change/").content.decode()
    listing = admin_client.get("/admin/clusters/projectslurmaccount/?state__exact=error").content.decode()

    assert "Account in a tenant&#x27;s subtree that no project uses" in detail
    assert "acme_old" in detail
    assert "Left &lt;b&gt;" in detail
    assert "acme_vision" in listing
    assert "Slurm refused" in listing
    assert admin_client.get("/admin/clusters/projectslurmaccount/add/").status_code == 403
    assert admin_client.get("/admin/clusters/slurmdriftreport/add/").status_code == 403
