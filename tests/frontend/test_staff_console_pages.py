"""The portal admins' console through the test client: tenants and projects created and edited with their
errors beside the fields, clusters registered and checked (through a worker, which is recorded here), rates
refusing free text and explaining the priced-usage rule, and the audit log; tenant admins are refused and
nothing changes."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Rate
from billing.rates import rate_create
from billing.usage import usage_import
from clusters.models import Cluster
from tenants.models import SLUG_MESSAGE, AuditEvent, Project, Tenant, TenantMembership
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.conftest import SentTask
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


class World:
    def __init__(self) -> None:
        self.staff = make_user("root", is_staff=True)
        self.tenant_admin = make_user("tadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision = make_project(self.acme, "vision")
        self.ann = make_user("ann")
        add_project_member(self.vision, self.ann)
        self.cluster = make_matrix_cluster("consolecluster")


@pytest.fixture
def world() -> World:
    return World()


def _client(user: Any) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _html(response: Any) -> str:
    return str(response.content.decode())


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


# Permissions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/staff/tenants/",
        "/staff/tenants/acme/",
        "/staff/tenants/acme/projects/vision/",
        "/staff/clusters/consolecluster/",
        "/staff/audit/",
    ],
)
def test_the_console_pages_are_for_portal_admins(world: World, url: str) -> None:
    assert _client(world.staff).get(url).status_code == 200
    refused = _client(world.tenant_admin).get(url)
    assert refused.status_code == 403
    assert "The admin pages are for portal admins" in _html(refused)
    assert _client(world.ann).get(url).status_code == 403
    assert _client(None).get(url).status_code == 302


def test_a_tenant_admin_changes_nothing_through_the_console(world: World, sent_tasks: list[SentTask]) -> None:
    client = _client(world.tenant_admin)
    events_before = AuditEvent.objects.count()

    posts = {
        "/staff/tenants/": {"slug": "sneaky", "name": "Sneaky"},
        "/staff/tenants/acme/": {"name": "Renamed"},
        "/staff/tenants/acme/projects/": {"slug": "sneaky", "name": "Sneaky"},
        "/staff/tenants/acme/projects/vision/": {"name": "Renamed"},
        "/staff/clusters/": {
            "name": "sneaky",
            "slurmrestd_url": "http://127.0.0.1:9",
            "jwt_key_file": "/k",
            "admin_user": "root",
            "log_root": "/tmp",
        },
        "/staff/clusters/consolecluster/check/": {},
    }
    for url, form in posts.items():
        assert client.post(url, form).status_code == 403, url

    assert not Tenant.objects.filter(slug="sneaky").exists()
    assert not Project.objects.filter(slug="sneaky").exists()
    assert not Cluster.objects.filter(name="sneaky").exists()
    assert Tenant.objects.get(slug="acme").name == "Test tenant"
    assert Project.objects.get(slug="vision").name == "Test project"
    assert AuditEvent.objects.count() == events_before
    assert sent_tasks == []


# Tenants -----------------------------------------------------------------------------------------------


def test_creating_a_tenant_audits_it_and_opens_its_page(world: World) -> None:
    client = _client(world.staff)

    response = client.post("/staff/tenants/", {"slug": "north-lab", "name": "  North lab ", "description": "GPUs"})

    assert response.status_code == 302
    assert response.headers["Location"] == "/staff/tenants/north-lab/"
    tenant = Tenant.objects.get(slug="north-lab")
    assert (tenant.name, tenant.description, tenant.slurm_parent_account) == ("North lab", "GPUs", "t_north-lab")
    (event,) = _events("tenant.created")[-1:]
    assert (event.actor_username, event.target_label, event.after) == (
        "root",
        "north-lab",
        {"slug": "north-lab", "name": "North lab", "description": "GPUs"},
    )
    html = _html(client.get(response.headers["Location"]))
    assert "Tenant north-lab created; add its members and projects below." in html
    assert '<a href="/tenants/north-lab/">Manage members of north-lab</a>' in html


def test_a_tenant_with_a_bad_or_taken_slug_or_no_name_is_refused_beside_its_fields(world: World) -> None:
    client = _client(world.staff)
    tenants_before = Tenant.objects.count()

    bad = client.post("/staff/tenants/", {"slug": "North Lab", "name": ""})
    assert bad.status_code == 400
    html = _html(bad)
    assert (
        '<p class="field-error" id="id_name-error">A name is required: a few words people will recognise.</p>' in html
    )
    # The form's own checks pass the slug on; the service names what is wrong with it.
    bad = client.post("/staff/tenants/", {"slug": "North Lab", "name": "North"})
    assert bad.status_code == 400
    assert f"&#x27;North Lab&#x27; is not a valid slug. {SLUG_MESSAGE}".replace("'", "&#x27;") in _html(bad)
    assert 'aria-invalid="true"' in _html(bad)

    taken = client.post("/staff/tenants/", {"slug": "acme", "name": "Another acme"})
    assert taken.status_code == 400
    assert "A tenant &#x27;acme&#x27; already exists; choose another slug." in _html(taken)

    assert Tenant.objects.count() == tenants_before
    assert _events("tenant.created")[-1].target_label == "acme"  # the world's own, nothing newer


def test_tenants_are_searched_and_paginated(world: World) -> None:
    for number in range(26):
        make_tenant(f"lab-{number:02d}")
    client = _client(world.staff)

    first = _html(client.get("/staff/tenants/?q=lab"))
    assert "Page 1 of 2" in first
    assert '<a href="/staff/tenants/lab-00/">lab-00</a>' in first
    assert '<a href="/staff/tenants/acme/">acme</a>' not in first
    assert '<a href="?q=lab&amp;page=2">Next</a>' in first
    second = _html(client.get("/staff/tenants/?q=lab&page=2"))
    assert '<a href="/staff/tenants/lab-25/">lab-25</a>' in second
    assert '<a href="/staff/tenants/lab-00/">lab-00</a>' not in second

    none = _html(client.get("/staff/tenants/?q=nothing-like-this"))
    assert 'No tenant\'s slug or name contains "nothing-like-this".' in none


def test_editing_a_tenant_audits_before_and_after_and_keeps_its_slug(world: World) -> None:
    client = _client(world.staff)

    response = client.post("/staff/tenants/acme/", {"name": "Acme Research", "description": "Vision group"})

    assert response.status_code == 302
    tenant = Tenant.objects.get(pk=world.acme.pk)
    assert (tenant.slug, tenant.name, tenant.description) == ("acme", "Acme Research", "Vision group")
    (event,) = _events("tenant.updated")
    assert event.before == {"slug": "acme", "name": "Test tenant", "description": ""}
    assert event.after == {"slug": "acme", "name": "Acme Research", "description": "Vision group"}

    empty = client.post("/staff/tenants/acme/", {"name": " ", "description": ""})
    assert empty.status_code == 400
    assert "A name is required: a few words people will recognise." in _html(empty)
    assert Tenant.objects.get(pk=world.acme.pk).name == "Acme Research"
    assert client.get("/staff/tenants/ghost/").status_code == 404


# Projects ----------------------------------------------------------------------------------------------


def test_creating_a_project_audits_it_and_schedules_its_slurm_account(
    world: World, sent_tasks: list[SentTask], django_capture_on_commit_callbacks: Any
) -> None:
    client = _client(world.staff)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/staff/tenants/acme/projects/", {"slug": "nlp", "name": "Language models"})

    assert response.status_code == 302
    assert response.headers["Location"] == "/staff/tenants/acme/projects/nlp/"
    project = Project.objects.get(tenant=world.acme, slug="nlp")
    assert (project.name, project.slurm_account) == ("Language models", "acme_nlp")
    assert ("clusters.tasks.project_slurm_sync", (project.pk,)) in sent_tasks
    (event,) = _events("project.created")[-1:]
    assert (event.actor_username, event.tenant, event.target_label) == ("root", world.acme, "acme/nlp")
    html = _html(client.get(response.headers["Location"]))
    assert "its Slurm account acme_nlp is being created on every active cluster." in html
    assert '<span class="badge badge-pending" id="account-state-consolecluster">Pending</span>' in html
    assert '<a href="/projects/acme/nlp/members/">Manage members of acme/nlp</a>' in html


def test_a_project_with_a_taken_or_bad_slug_is_refused_beside_its_field(world: World) -> None:
    client = _client(world.staff)
    projects_before = Project.objects.count()

    taken = client.post("/staff/tenants/acme/projects/", {"slug": "vision", "name": "Again"})
    assert taken.status_code == 400
    html = _html(taken)
    assert (
        '<p class="field-error" id="id_project_slug-error">Tenant &#x27;acme&#x27; already has a project '
        "&#x27;vision&#x27;; choose another slug.</p>" in html
    )
    bad = client.post("/staff/tenants/acme/projects/", {"slug": "-x", "name": ""})
    assert bad.status_code == 400
    assert "A name is required" in _html(bad)
    bad = client.post("/staff/tenants/acme/projects/", {"slug": "-x", "name": "X"})
    assert "is not a valid slug" in _html(bad)

    assert Project.objects.count() == projects_before


def test_editing_a_project_audits_it_and_never_changes_its_slug_or_account(world: World) -> None:
    client = _client(world.staff)

    response = client.post(
        "/staff/tenants/acme/projects/vision/", {"name": "Vision models", "description": "x", "slug": "renamed"}
    )

    assert response.status_code == 302
    project = Project.objects.get(pk=world.vision.pk)
    assert (project.slug, project.slurm_account, project.name) == ("vision", "acme_vision", "Vision models")
    (event,) = _events("project.updated")
    assert event.before is not None
    assert event.after is not None
    assert (event.before["name"], event.after["name"]) == ("Test project", "Vision models")
    assert client.get("/staff/tenants/acme/projects/ghost/").status_code == 404
    assert client.get("/staff/tenants/ghost/projects/vision/").status_code == 404


def test_a_portal_admin_manages_members_on_the_tenants_and_projects_own_pages(world: World) -> None:
    client = _client(world.staff)
    bob = make_user("bob")

    assert client.post("/tenants/acme/members/", {"username": "bob", "role": "member"}).status_code == 302
    assert client.post("/tenants/acme/members/bob/", {"role": "admin"}).status_code == 302
    assert client.post("/projects/acme/vision/members/", {"username": "bob", "role": "manager"}).status_code == 302
    assert client.post("/tenants/acme/members/bob/remove/", {}).status_code == 302

    assert not TenantMembership.objects.filter(user=bob).exists()
    actions = list(AuditEvent.objects.filter(actor_username="root").order_by("id").values_list("action", flat=True))
    assert actions == [
        "tenant_member.added",
        "tenant_member.role_changed",
        "project_member.added",
        "project_member.removed",
        "tenant_member.removed",
    ]


# Clusters ----------------------------------------------------------------------------------------------

CLUSTER_FORM = {
    "name": "east",
    "slurmrestd_url": "http://slurm-east.example.org:6820",
    "jwt_key_file": "/etc/gpuportal/east.key",
    "admin_user": "slurm",
    "log_root": "/shared/east/logs",
}


def test_registering_a_cluster_stores_it_audits_it_and_asks_a_worker_to_check_it(
    world: World, sent_tasks: list[SentTask], django_capture_on_commit_callbacks: Any
) -> None:
    client = _client(world.staff)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/staff/clusters/", CLUSTER_FORM)

    assert response.status_code == 302
    assert response.headers["Location"] == "/staff/clusters/east/"
    cluster = Cluster.objects.get(name="east")
    assert (cluster.slurmrestd_url, cluster.jwt_key_file, cluster.admin_user, cluster.log_root, cluster.is_active) == (
        "http://slurm-east.example.org:6820",
        "/etc/gpuportal/east.key",
        "slurm",
        "/shared/east/logs",
        True,
    )
    assert sent_tasks == [("clusters.tasks.cluster_sync", (cluster.pk,))]
    (event,) = _events("cluster.registered")
    assert (event.actor_username, event.after) == ("root", CLUSTER_FORM)
    html = _html(client.get("/staff/clusters/east/"))
    assert '<dd id="cluster-reachable">Never checked</dd>' in html


def test_a_cluster_with_a_taken_name_or_a_bad_url_is_refused_beside_its_field(
    world: World, sent_tasks: list[SentTask]
) -> None:
    client = _client(world.staff)

    taken = client.post("/staff/clusters/", CLUSTER_FORM | {"name": "consolecluster"})
    assert taken.status_code == 400
    assert (
        '<p class="field-error" id="id_name-error">A cluster &#x27;consolecluster&#x27; is already registered; '
        "choose another name.</p>" in _html(taken)
    )
    bad = client.post("/staff/clusters/", CLUSTER_FORM | {"slurmrestd_url": "slurm east", "name": "no spaces"})
    assert bad.status_code == 400
    assert (
        "Give a URL with its scheme and a full host name or IP address, e.g. http://slurm-head.example.org:6820."
        in _html(bad)
    )
    assert "Use letters, digits, hyphens and underscores only, e.g. north." in _html(bad)

    assert not Cluster.objects.filter(name__in=["east", "no spaces"]).exists()
    assert sent_tasks == []
    assert _events("cluster.registered") == []


def test_a_check_asks_a_worker_and_the_page_waits_for_its_answer(
    world: World, sent_tasks: list[SentTask], django_capture_on_commit_callbacks: Any
) -> None:
    client = _client(world.staff)
    Cluster.objects.filter(pk=world.cluster.pk).update(last_ping_at=timezone.now() - timedelta(minutes=5))

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/staff/clusters/consolecluster/check/")

    assert response.status_code == 302
    assert sent_tasks == [("clusters.tasks.cluster_sync", (world.cluster.pk,))]
    waiting = _html(client.get(response.headers["Location"]))
    assert "Waiting for a worker's answer…" in waiting
    assert 'hx-trigger="load delay:2s"' in waiting

    # The worker's answer recorded: the status part (as htmx asks for it) stops waiting and shows it.
    Cluster.objects.filter(pk=world.cluster.pk).update(
        last_ping_at=timezone.now(), last_ping_ok=True, slurm_release="24.11.1", api_version="0.0.42"
    )
    answered = _html(client.get(response.headers["Location"], headers={"HX-Request": "true"}))
    assert answered.lstrip().startswith('<section id="cluster-status"')
    assert "hx-trigger" not in answered
    assert '<dd id="cluster-reachable"><span class="health-ok">Yes</span>' in answered
    assert '<dd id="cluster-version">Slurm 24.11.1; slurmrestd API 0.0.42</dd>' in answered
    assert '<dd id="cluster-partitions">gpu (default): UP, 1 node</dd>' in answered
    assert client.post("/staff/clusters/ghost/check/").status_code == 404


# Rates -------------------------------------------------------------------------------------------------


def _rate_form(**overrides: str) -> dict[str, str]:
    return {
        "cluster": "consolecluster",
        "gpu_type": "h100",
        "price_per_gpu_hour": "2.50",
        "currency": "EUR",
        "valid_from": "2099-01-01",
        "note": "",
    } | overrides


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ("two euros", "Give the price as a number, e.g. 2.50: digits and a decimal point only, no currency or words."),
        ("2,50", "Give the price as a number, e.g. 2.50: digits and a decimal point only, no currency or words."),
        ("2.12345", "Give at most 4 decimals, e.g. 2.1250."),
        ("-1", "A price cannot be negative; 0 makes the GPU-hours free."),
        ("", "Give the price of one GPU-hour, e.g. 2.50."),
    ],
)
def test_a_price_that_is_not_a_money_amount_is_refused_by_name(world: World, price: str, message: str) -> None:
    response = _client(world.staff).post("/staff/rates/", _rate_form(price_per_gpu_hour=price))

    assert response.status_code == 400
    assert f'<p class="field-error" id="id_price_per_gpu_hour-error">{message}</p>' in _html(response)
    assert not Rate.objects.exists()


def test_the_price_input_takes_up_to_four_decimals_and_no_negatives(world: World) -> None:
    html = _html(_client(world.staff).get("/staff/rates/"))

    assert 'type="number" name="price_per_gpu_hour"' in html
    assert 'step="0.0001"' in html
    assert 'min="0"' in html
    assert 'inputmode="decimal"' in html
    assert "A new rate never changes past charges" in html


def test_the_rates_page_shows_how_far_usage_is_priced_and_refuses_a_rate_starting_earlier(world: World) -> None:
    month = previous_month(timezone.now().date().replace(day=1))
    rate_create(
        actor=None,
        cluster=world.cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal(2),
        currency="EUR",
        valid_from=at(month),
    )
    charged_job(world.vision, world.cluster, start=at(month, 10), end=at(month, 13), user=world.ann)
    usage_import()
    client = _client(world.staff)

    html = _html(client.get("/staff/rates/"))
    assert "<dt>Currency of consolecluster</dt><dd>EUR</dd>" in html
    until = at(month, 13)
    assert f'<dt>consolecluster, h100</dt><dd>priced up to <time datetime="{until.isoformat()}">' in html
    assert f"{until:%Y-%m-%d %H:%M:%S} UTC</time>: a new rate starts then or later</dd>" in html

    early = client.post("/staff/rates/", _rate_form(valid_from=f"{at(month, 12):%Y-%m-%dT%H:%M}"))
    assert early.status_code == 409
    assert "is already priced up to" in _html(early)
    dollars = client.post("/staff/rates/", _rate_form(currency="USD"))
    assert dollars.status_code == 400
    assert "Rates of consolecluster are in EUR; a cluster prices in one currency." in _html(dollars)
    assert Rate.objects.count() == 1

    assert client.post("/staff/rates/", _rate_form(valid_from=f"{until:%Y-%m-%dT%H:%M}")).status_code == 302
    (event,) = _events("rate.create")[-1:]
    assert event.after is not None
    assert (event.actor_username, event.after["price_per_gpu_hour"]) == ("root", "2.50")


# Audit log ---------------------------------------------------------------------------------------------


def test_the_audit_log_lists_changes_newest_first_by_kind_a_page_at_a_time(world: World) -> None:
    client = _client(world.staff)
    for number in range(26):
        client.post("/staff/tenants/", {"slug": f"audit-{number:02d}", "name": f"Audit {number}"})

    first = _html(client.get("/staff/audit/?kind=tenant"))
    assert "Page 1 of 2" in first
    assert first.index("<td>audit-25</td>") < first.index("<td>audit-24</td>")
    assert "tenant_member.added" not in first
    assert '<option value="tenant" selected>Tenants</option>' in first
    second = _html(client.get("/staff/audit/?kind=tenant&page=2"))
    # 26 created here, and acme by the world (by no one: "system").
    assert '<td class="priority-2">system</td>' in second

    members = _html(client.get("/staff/audit/?kind=project_member"))
    assert "<code>project_member.added</code>" in members
    assert "<code>tenant.created</code>" not in members
    everything = _html(client.get("/staff/audit/?kind=no-such-kind"))
    # An unknown kind shows every kind: 27 tenants, 2 tenant members, a project and its member.
    assert " selected>" not in everything
    assert "Page 1 of 2" in everything
    assert "<code>project_member.added</code>" in _html(client.get("/staff/audit/?kind=no-such-kind&page=2"))
