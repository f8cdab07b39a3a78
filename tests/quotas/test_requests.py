"""Asking for more GPU-hours, approving in full or in part, denying, tenant pools: through the REST API."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Protocol

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster
from quotas.models import Allocation, LedgerEntry, LedgerKind, QuotaRequest, TenantPool
from tenants.models import AuditEvent, Notification
from tests.conftest import SentTask
from tests.factories import (
    add_project_member,
    add_tenant_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


class CaptureOnCommit(Protocol):
    def __call__(self, *, execute: bool = ...) -> AbstractContextManager[list[Any]]: ...


@pytest.fixture(autouse=True)
def queued_tasks(sent_tasks: list[SentTask]) -> list[SentTask]:
    """Tasks the services hand to the broker after commit, recorded instead of sent: these tests run no worker."""
    return sent_tasks


def client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def assert_error(response: Any, status: int, *, message: str | None = None, fields: list[str] | None = None) -> Any:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    if message is not None:
        assert body["message"] == message
    assert sorted(body["fields"]) == sorted(fields or [])
    return body


class World:
    def __init__(self) -> None:
        self.cluster: Cluster = make_matrix_cluster()
        self.root = make_user("root", is_staff=True)
        self.ada = make_user("ada")  # acme's tenant admin
        self.tenant = make_tenant("acme", admin=self.ada)
        self.vision = make_project(self.tenant, "vision")
        self.alice = make_user("alice")
        self.mona = make_user("mona")
        self.victor = make_user("victor")
        add_project_member(self.vision, self.alice, "member")
        add_project_member(self.vision, self.mona, "manager")
        add_project_member(self.vision, self.victor, "viewer")
        self.gina = make_user("gina")  # a member of another tenant
        self.globex = make_tenant("globex", admin=make_user("gus"))
        add_project_member(make_project(self.globex, "genomics"), self.gina, "member")
        for user in (self.root, self.ada, self.alice, self.mona, self.victor, self.gina):
            user.email = f"{user.username}@example.org"
            user.save(update_fields=["email"])
        today = timezone.now().date()
        self.starts_on, self.ends_on = today - timedelta(days=3), today + timedelta(days=26)
        self.allocation = grant_allocation(
            self.vision, self.cluster, gpu_hours=100, starts_on=self.starts_on, ends_on=self.ends_on
        )

    def ask(self, *, gpu_hours: str, justification: str = "Ablation runs for the paper") -> dict[str, Any]:
        response = client_for(self.alice).post(
            f"/api/v1/allocations/{self.allocation.pk}/requests/",
            {"gpu_hours": gpu_hours, "justification": justification},
            format="json",
        )
        assert response.status_code == 201, response.content
        body: dict[str, Any] = response.json()
        return body

    def decide(self, user: Any, request_id: int, approve: str | None, reason: str = "") -> Any:
        return client_for(user).post(
            f"/api/v1/quota-requests/{request_id}/decide/",
            {"approve_gpu_hours": approve, "reason": reason},
            format="json",
        )

    def pool(self, gpu_hours: str) -> TenantPool:
        response = client_for(self.root).post(
            "/api/v1/tenant-pools/",
            {
                "tenant": "acme",
                "cluster": self.cluster.name,
                "gpu_hours": gpu_hours,
                "starts_on": self.starts_on.replace(day=1).isoformat(),
                "ends_on": (self.ends_on + timedelta(days=31)).isoformat(),
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        return TenantPool.objects.get(pk=response.json()["id"])


@pytest.fixture
def world() -> World:
    return World()


def test_a_member_asks_a_portal_admin_approves_in_part_and_the_new_remaining_shows_at_once(
    world: World, django_capture_on_commit_callbacks: CaptureOnCommit, queued_tasks: list[Any]
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        asked = world.ask(gpu_hours="50", justification="  Ablation runs for the paper  ")

    assert asked["state"] == "pending"
    assert asked["requested_by"] == "alice"
    assert (asked["requested_gpu_hours"], asked["requested_gpu_seconds"]) == ("50.00", 180_000)
    assert asked["justification"] == "Ablation runs for the paper"
    assert (asked["granted_gpu_hours"], asked["decided_by"], asked["decision_reason"]) == ("0.00", None, "")
    assert asked["allocation"]["remaining_gpu_hours"] == "100.00"
    assert asked["links"]["decide"] == f"/api/v1/quota-requests/{asked['id']}/decide/"
    # The deciders are told: the tenant's admin and the portal admin, in the portal and by e-mail.
    told = Notification.objects.filter(kind="quota.request").order_by("user__username")
    assert [(n.user.username, n.title, n.link) for n in told] == [
        (name, "acme/vision: alice asks for 50.0 GPU-hours", f"/requests/{asked['id']}/") for name in ("ada", "root")
    ]
    assert sorted(message.to[0] for message in mail.outbox) == ["ada@example.org", "root@example.org"]
    mail.outbox.clear()
    queued_tasks.clear()

    with django_capture_on_commit_callbacks(execute=True):
        response = world.decide(world.root, asked["id"], "20.5", "Half now, the rest after the review")

    assert response.status_code == 200, response.content
    decided = response.json()
    assert decided["state"] == "partially_approved"
    assert (decided["granted_gpu_hours"], decided["granted_gpu_seconds"]) == ("20.50", 73_800)
    assert (decided["decided_by"], decided["decision_reason"]) == ("root", "Half now, the rest after the review")
    assert decided["allocation"]["granted_gpu_hours"] == "120.50"
    assert (decided["allocation"]["remaining_gpu_hours"], decided["allocation"]["remaining_gpu_seconds"]) == (
        "120.50",
        433_800,
    )
    # At once: the allocation's requests, as the member reads them, and its balances in the database.
    listed = client_for(world.alice).get(f"/api/v1/allocations/{world.allocation.pk}/requests/").json()
    assert listed["count"] == 1
    assert listed["results"][0]["state"] == "partially_approved"
    assert listed["results"][0]["allocation"]["remaining_gpu_seconds"] == 433_800
    world.allocation.refresh_from_db()
    assert (world.allocation.granted_gpu_seconds, world.allocation.remaining_gpu_seconds) == (433_800, 433_800)
    grant = LedgerEntry.objects.filter(allocation=world.allocation, kind=LedgerKind.GRANT).last()
    assert grant is not None
    assert (grant.gpu_seconds, grant.note, grant.actor) == (73_800, f"request {asked['id']}", world.root)
    # Slurm's limit follows the grant.
    assert queued_tasks == [("quotas.tasks.quota_limit_sync", (world.vision.pk, world.cluster.pk))]
    # The requester is told in the portal and by e-mail, with the reason.
    notification = Notification.objects.get(user=world.alice)
    assert notification.kind == "quota.request_decided"
    assert notification.link == f"/projects/acme/vision/allocations/{world.allocation.pk}/"
    assert notification.title == "acme/vision: your request was approved in part: 20.5 of 50.0 GPU-hours"
    assert notification.body == (
        f"root approved in part your request on acme/vision on cluster matrixcluster for {world.starts_on} to "
        f"{world.ends_on}: 20.5 of 50.0 GPU-hours granted; 120.5 GPU-hours are left now. "
        "Reason: Half now, the rest after the review"
    )
    assert [(m.to, m.subject) for m in mail.outbox] == [(["alice@example.org"], f"[GPU portal] {notification.title}")]
    assert "Reason: Half now, the rest after the review" in mail.outbox[0].body
    actions = list(
        AuditEvent.objects.filter(action__startswith="quota_request").order_by("id").values_list("action", "actor")
    )
    assert actions == [("quota_request.create", world.alice.pk), ("quota_request.approve", world.root.pk)]
    approve = AuditEvent.objects.get(action="quota_request.approve")
    assert approve.tenant == world.tenant
    assert approve.before is not None
    assert approve.after is not None
    assert (approve.before["state"], approve.after["state"]) == ("pending", "partially_approved")
    assert approve.after["granted_gpu_seconds"] == 73_800


def test_approving_all_of_a_request_marks_it_approved(world: World) -> None:
    asked = world.ask(gpu_hours="12.25")

    decided = world.decide(world.root, asked["id"], "12.25").json()

    assert (decided["state"], decided["granted_gpu_seconds"], decided["decision_reason"]) == ("approved", 44_100, "")
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 360_000 + 44_100


def test_a_denial_needs_a_reason_and_the_requester_reads_it(
    world: World, django_capture_on_commit_callbacks: CaptureOnCommit
) -> None:
    asked = world.ask(gpu_hours="40")
    mail.outbox.clear()

    for approve in (None, "0"):
        refused = world.decide(world.ada, asked["id"], approve, "   ")
        assert_error(
            refused, 400, message="reason: Say why the request is denied; the requester reads it.", fields=["reason"]
        )
    assert QuotaRequest.objects.get(pk=asked["id"]).state == "pending"
    assert not AuditEvent.objects.filter(action="quota_request.deny").exists()
    assert not Notification.objects.filter(user=world.alice).exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = world.decide(world.ada, asked["id"], None, "The cluster is booked for the course this month")

    denied = response.json()
    assert (denied["state"], denied["granted_gpu_seconds"], denied["decided_by"]) == ("denied", 0, "ada")
    assert denied["allocation"]["granted_gpu_seconds"] == 360_000
    notification = Notification.objects.get(user=world.alice)
    assert notification.title == "acme/vision: your request for 40.0 GPU-hours was denied"
    assert notification.body.endswith("Reason: The cluster is booked for the course this month")
    assert [m.to for m in mail.outbox] == [["alice@example.org"]]
    assert AuditEvent.objects.get(action="quota_request.deny").actor == world.ada
    # A decided request is decided once.
    again = world.decide(world.root, asked["id"], "40")
    assert_error(
        again,
        409,
        message=(
            f"Request {asked['id']} is denied already; only pending requests can be decided or withdrawn. "
            "Ask again with a new request."
        ),
    )
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 360_000


def test_a_tenant_admin_approves_within_the_tenant_pool_and_is_refused_beyond_it(world: World) -> None:
    first = world.ask(gpu_hours="25")

    no_pool = world.decide(world.ada, first["id"], "20")
    assert_error(
        no_pool,
        409,
        message=(
            f"Tenant 'acme' has no pool of GPU-hours on cluster matrixcluster covering {world.starts_on} to "
            f"{world.ends_on} to approve from; ask a portal admin to approve this request, "
            "or to give the tenant a pool."
        ),
    )
    assert QuotaRequest.objects.get(pk=first["id"]).state == "pending"

    pool = world.pool("30")
    approved = world.decide(world.ada, first["id"], "20")
    assert approved.status_code == 200, approved.content
    assert (approved.json()["state"], approved.json()["allocation"]["granted_gpu_seconds"]) == (
        "partially_approved",
        360_000 + 72_000,
    )
    pool.refresh_from_db()
    assert (pool.distributed_gpu_seconds, pool.available_gpu_seconds) == (72_000, 36_000)

    second = world.ask(gpu_hours="25")
    beyond = world.decide(world.ada, second["id"], "25")
    assert_error(
        beyond,
        409,
        message=(
            f"Tenant 'acme''s pool on cluster matrixcluster for {pool.starts_on} to {pool.ends_on} has 10.0 GPU-hours "
            "left, less than the 25.0 to approve; approve at most 10.0, or ask a portal admin."
        ),
    )
    assert beyond.json()["code"] == "pool_exhausted"
    # Nothing happened: the request waits, the allocation and the pool are as they were.
    assert QuotaRequest.objects.get(pk=second["id"]).state == "pending"
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 432_000
    pool.refresh_from_db()
    assert pool.distributed_gpu_seconds == 72_000
    assert not AuditEvent.objects.filter(action="quota_request.approve", target_id=str(second["id"])).exists()

    within = world.decide(world.ada, second["id"], "10")
    assert within.json()["state"] == "partially_approved"
    pools = client_for(world.ada).get("/api/v1/tenant-pools/").json()
    assert [
        (p["tenant"], p["gpu_hours"], p["distributed_gpu_hours"], p["available_gpu_hours"]) for p in pools["results"]
    ] == [("acme", "30.00", "30.00", "0.00")]
    # A portal admin approves without drawing on the pool.
    third = world.ask(gpu_hours="5")
    assert world.decide(world.root, third["id"], "5").json()["state"] == "approved"
    pool.refresh_from_db()
    assert pool.distributed_gpu_seconds == 108_000


def test_tenant_pools_are_given_by_portal_admins_and_read_by_the_tenant_admins(world: World) -> None:
    body = {
        "tenant": "acme",
        "cluster": world.cluster.name,
        "gpu_hours": "30",
        "starts_on": world.starts_on.isoformat(),
        "ends_on": world.ends_on.isoformat(),
    }
    refused = client_for(world.ada).post("/api/v1/tenant-pools/", body, format="json")
    assert_error(refused, 403, message="Giving a tenant a pool of GPU-hours needs a portal admin.")
    assert not TenantPool.objects.exists()

    world.pool("30")
    overlapping = client_for(world.root).post("/api/v1/tenant-pools/", body, format="json")
    assert overlapping.status_code == 409
    assert TenantPool.objects.count() == 1
    assert AuditEvent.objects.filter(action="tenant_pool.create").count() == 1

    assert client_for(world.ada).get("/api/v1/tenant-pools/").json()["count"] == 1
    assert client_for(world.alice).get("/api/v1/tenant-pools/").json()["count"] == 0
    assert_error(
        client_for(world.alice).get("/api/v1/tenant-pools/?tenant=acme"),
        403,
        message=(
            "This needs the tenant role 'admin' in tenant 'acme'; you are 'member'. Ask one of the tenant's admins."
        ),
    )
    assert_error(
        client_for(world.gina).get("/api/v1/tenant-pools/?tenant=acme"),
        404,
        message="No tenant 'acme' exists among the ones you can see; check the name or ask for access.",
    )


def test_a_member_of_another_tenant_gets_404_on_every_route(world: World) -> None:
    asked = world.ask(gpu_hours="10")
    missing_allocation, missing_request = world.allocation.pk + 1000, asked["id"] + 1000
    outsider = client_for(world.gina)

    def allocation_404(allocation_id: int) -> str:
        return (
            f"No allocation {allocation_id} exists among the ones you can see; "
            "list yours with GET /api/v1/allocations/."
        )

    def request_404(request_id: int) -> str:
        return (
            f"No quota request {request_id} exists among the ones you can see; "
            "list yours with GET /api/v1/quota-requests/."
        )

    for allocation_id in (world.allocation.pk, missing_allocation):
        message = allocation_404(allocation_id)
        assert_error(outsider.get(f"/api/v1/allocations/{allocation_id}/requests/"), 404, message=message)
        created = outsider.post(
            f"/api/v1/allocations/{allocation_id}/requests/", {"gpu_hours": "5", "justification": "x"}, format="json"
        )
        assert_error(created, 404, message=message)
        assert_error(outsider.get(f"/api/v1/allocations/{allocation_id}/usage/"), 404, message=message)
    for request_id in (asked["id"], missing_request):
        message = request_404(request_id)
        assert_error(outsider.get(f"/api/v1/quota-requests/{request_id}/"), 404, message=message)
        decided = outsider.post(
            f"/api/v1/quota-requests/{request_id}/decide/", {"approve_gpu_hours": "5"}, format="json"
        )
        assert_error(decided, 404, message=message)
        assert_error(outsider.post(f"/api/v1/quota-requests/{request_id}/withdraw/"), 404, message=message)
    assert outsider.get("/api/v1/quota-requests/").json()["count"] == 0
    assert_error(
        outsider.get("/api/v1/quota-requests/?tenant=acme"),
        404,
        message="No tenant 'acme' exists among the ones you can see; check the name or ask for access.",
    )
    # Nothing happened.
    assert list(QuotaRequest.objects.values_list("state", flat=True)) == ["pending"]
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 360_000


def test_roles_too_low_get_403_naming_the_role_needed(world: World) -> None:
    asked = world.ask(gpu_hours="10")
    body = {"gpu_hours": "5", "justification": "More epochs"}

    viewer = client_for(world.victor).post(f"/api/v1/allocations/{world.allocation.pk}/requests/", body, format="json")
    assert_error(
        viewer,
        403,
        message="This needs the project role 'manager' or 'member' in project 'acme/vision'; you are 'viewer'.",
    )
    # A tenant admin without a project role decides, but does not ask (only project roles submit).
    admin = client_for(world.ada).post(f"/api/v1/allocations/{world.allocation.pk}/requests/", body, format="json")
    assert_error(
        admin,
        403,
        message="This needs the project role 'manager' or 'member' in project 'acme/vision'; you have no role in it.",
    )
    for user in (world.alice, world.mona, world.victor):
        refused = world.decide(user, asked["id"], "10")
        assert_error(
            refused,
            403,
            message=(
                "Deciding a request needs the tenant role 'admin' in tenant 'acme', or a portal admin; "
                "ask one of the tenant's admins."
            ),
        )
    withdrawn = client_for(world.mona).post(f"/api/v1/quota-requests/{asked['id']}/withdraw/")
    assert_error(withdrawn, 403, message="Only alice, who asked, may withdraw this request; admins deny it instead.")
    # A tenant member without a role in the project is told so, as for the project itself.
    tina = make_user("tina")
    add_tenant_member(world.tenant, tina)
    assert_error(
        client_for(tina).get(f"/api/v1/quota-requests/{asked['id']}/"),
        403,
        message=(
            "This needs the project role 'manager' or 'member' or 'viewer', or the tenant role 'admin' in 'acme' "
            "in project 'acme/vision'; you have no role in it."
        ),
    )
    assert client_for(tina).get("/api/v1/quota-requests/").json()["count"] == 0
    # Viewers read the requests of their project.
    assert client_for(world.victor).get(f"/api/v1/allocations/{world.allocation.pk}/requests/").json()["count"] == 1
    assert QuotaRequest.objects.count() == 1
    assert QuotaRequest.objects.get().state == "pending"


def test_the_requester_withdraws_a_pending_request(world: World) -> None:
    asked = world.ask(gpu_hours="10")

    response = client_for(world.alice).post(f"/api/v1/quota-requests/{asked['id']}/withdraw/")

    assert response.status_code == 200, response.content
    assert (response.json()["state"], response.json()["decided_by"]) == ("withdrawn", "alice")
    assert AuditEvent.objects.filter(action="quota_request.withdraw", actor=world.alice).count() == 1
    assert world.decide(world.root, asked["id"], "10").status_code == 409
    assert client_for(world.alice).post(f"/api/v1/quota-requests/{asked['id']}/withdraw/").status_code == 409
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 360_000


def test_a_request_needs_positive_hours_and_a_justification(world: World) -> None:
    response = client_for(world.alice).post(
        f"/api/v1/allocations/{world.allocation.pk}/requests/", {"gpu_hours": "0", "justification": " "}, format="json"
    )

    body = assert_error(response, 400, fields=["gpu_hours", "justification"])
    assert body["fields"] == {
        "gpu_hours": ["Ask for more than 0 GPU-hours, e.g. 20 or 12.5."],
        "justification": ["Say what the hours are for, so that an admin can decide."],
    }
    assert not QuotaRequest.objects.exists()
    assert not Notification.objects.exists()

    asked = world.ask(gpu_hours="10")
    too_much = world.decide(world.root, asked["id"], "10.01")
    assert_error(
        too_much,
        400,
        message="approve_gpu_hours: Approve at most the 10.0 GPU-hours requested; grant more on the allocation itself.",
        fields=["approve_gpu_hours"],
    )
    assert QuotaRequest.objects.get(pk=asked["id"]).state == "pending"


def test_the_request_list_shows_what_each_user_may_see_and_filters(world: World) -> None:
    mine = world.ask(gpu_hours="10")
    decided = world.ask(gpu_hours="5")
    world.decide(world.root, decided["id"], "5")
    genomics = world.globex.projects.get()
    other = grant_allocation(genomics, world.cluster, gpu_hours=10)
    theirs = client_for(world.gina).post(
        f"/api/v1/allocations/{other.pk}/requests/", {"gpu_hours": "3", "justification": "Sequencing"}, format="json"
    )
    assert theirs.status_code == 201

    def ids(user: Any, query: str = "") -> list[int]:
        body = client_for(user).get(f"/api/v1/quota-requests/{query}").json()
        return [item["id"] for item in body["results"]]

    assert ids(world.alice) == [decided["id"], mine["id"]]
    assert ids(world.ada) == [decided["id"], mine["id"]]
    assert ids(world.gina) == [theirs.json()["id"]]
    assert ids(world.root) == [theirs.json()["id"], decided["id"], mine["id"]]
    assert ids(world.root, "?state=pending") == [theirs.json()["id"], mine["id"]]
    assert ids(world.root, "?state=pending&tenant=acme") == [mine["id"]]
    assert ids(world.ada, "?state=approved") == [decided["id"]]
    outsider_admin = make_user("olga")
    add_tenant_member(world.globex, outsider_admin, "admin")
    assert ids(outsider_admin) == [theirs.json()["id"]]
    assert_error(client_for(world.root).get("/api/v1/quota-requests/?state=lost"), 400, fields=["state"])


def test_requests_on_an_allocation_whose_period_ended_are_refused(world: World) -> None:
    today = timezone.now().date()
    old = grant_allocation(
        world.vision,
        world.cluster,
        gpu_hours=10,
        starts_on=today - timedelta(days=40),
        ends_on=today - timedelta(days=10),
    )

    response = client_for(world.alice).post(
        f"/api/v1/allocations/{old.pk}/requests/", {"gpu_hours": "5", "justification": "Late"}, format="json"
    )

    assert_error(
        response,
        409,
        message=(
            f"This allocation ended on {old.ends_on}; ask for hours on the project's current allocation "
            "(GET /api/v1/allocations/)."
        ),
    )
    assert not QuotaRequest.objects.exists()
    assert Allocation.objects.get(pk=old.pk).granted_gpu_seconds == 36_000


def test_a_request_whose_allocation_ended_before_the_decision_can_only_be_denied(world: World) -> None:
    request_id = world.ask(gpu_hours="5")["id"]
    Allocation.objects.filter(pk=world.allocation.pk).update(ends_on=timezone.now().date() - timedelta(days=1))

    refused = world.decide(world.root, request_id, "5")

    body = assert_error(refused, 409)
    assert body["message"].startswith(f"This allocation ended on {timezone.now().date() - timedelta(days=1)}")
    assert Allocation.objects.get(pk=world.allocation.pk).granted_gpu_seconds == 100 * 3600
    assert QuotaRequest.objects.get(pk=request_id).state == "pending"
    assert world.decide(world.root, request_id, None, "The period is over").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_two_tenant_admins_approving_at_once_never_hand_out_more_than_the_pool(world: World) -> None:
    second_admin = make_user("abe")
    add_tenant_member(world.tenant, second_admin, "admin")
    world.pool("30")
    asked = [world.ask(gpu_hours="20")["id"], world.ask(gpu_hours="20")["id"]]
    barrier = threading.Barrier(2)
    outcomes: list[int] = []

    def approve(admin: Any, request_id: int) -> None:
        barrier.wait()
        try:
            outcomes.append(world.decide(admin, request_id, "20").status_code)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=approve, args=(admin, request_id))
        for admin, request_id in zip((world.ada, second_admin), asked, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == [200, 409]
    assert sorted(QuotaRequest.objects.values_list("state", flat=True)) == ["approved", "pending"]
    assert TenantPool.objects.get().distributed_gpu_seconds == 72_000
    world.allocation.refresh_from_db()
    assert world.allocation.granted_gpu_seconds == 360_000 + 72_000
