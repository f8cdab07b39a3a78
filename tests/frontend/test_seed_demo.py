"""`manage.py seed_demo` builds the demo through the services and is safe to run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.models import Rate
from clusters.models import Cluster, ClusterAccount, DirectoryPosixUsername
from jobs.models import JobTemplate
from quotas.models import Allocation, TenantPool
from tenants.models import AuditEvent, DirectoryGroupRole, Project, ProjectMembership

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def cluster_registry(tmp_path: Path, settings: Any) -> Path:
    """The newer clusters as `scripts/cluster.sh up` describes them: north up, south unavailable."""
    described = {
        "north": {"status": "up", "slurmrestd_url": "http://127.0.0.1:6920", "log_root": "/srv/gpuportal/logs-north"},
        "south": {"status": "unavailable", "reason": "debootstrap failed", "slurmrestd_url": "http://127.0.0.1:7020"},
    }
    for name, fields in described.items():
        entry = {"name": name, "jwt_key_file": f"/keys/{name}.key", "admin_user": "root", **fields}
        (tmp_path / f"{name}.json").write_text(json.dumps(entry))
    settings.DEMO_CLUSTER_REGISTRY = str(tmp_path)
    return tmp_path


def test_seeding_twice_creates_everything_once() -> None:
    call_command("seed_demo", verbosity=0)
    events = AuditEvent.objects.count()

    call_command("seed_demo", verbosity=0)

    assert AuditEvent.objects.count() == events
    assert sorted(str(project) for project in Project.objects.all()) == ["acme/nlp", "acme/vision", "globex/genomics"]
    assert ProjectMembership.objects.count() == 4
    accounts = sorted(ClusterAccount.objects.values_list("cluster__name", "username"))
    assert accounts == [(cluster, user) for cluster in ("local", "north") for user in ("alice", "bob", "carol")]
    template = JobTemplate.objects.get()
    assert (str(template.project), template.name, template.gpus) == ("acme/vision", "Nightly evaluation", 2)
    # The demo provider's groups (scripts/oidc/provider.mjs) give these roles; its usernames are the POSIX users.
    assert sorted(str(mapping) for mapping in DirectoryGroupRole.objects.all()) == [
        "demo: acme-admins → admin of acme",
        "demo: acme-vision-members → member of acme/vision",
        "demo: globex-admins → admin of globex",
    ]
    assert sorted(str(mapping) for mapping in DirectoryPosixUsername.objects.all()) == [
        "demo: preferred_username on local",
        "demo: preferred_username on north",
    ]


def test_the_clusters_that_are_up_are_registered(cluster_registry: Path) -> None:
    call_command("seed_demo", verbosity=0)

    registered = {cluster.name: (cluster.slurmrestd_url, cluster.jwt_key_file) for cluster in Cluster.objects.all()}
    assert set(registered) == {"local", "north"}
    assert registered["north"] == ("http://127.0.0.1:6920", "/keys/north.key")


def test_the_demo_has_this_months_gpu_hours_on_each_cluster() -> None:
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)

    allocations = {
        (allocation.cluster.name, str(allocation.project), allocation.gpu_type): allocation.granted_gpu_seconds // 3600
        for allocation in Allocation.objects.select_related("project__tenant", "cluster")
    }
    assert allocations == {
        ("local", "acme/vision", "h100"): 500,
        ("local", "acme/nlp", "a100"): 100,
        ("local", "globex/genomics", ""): 50,
        ("north", "acme/vision", "l40s"): 200,
    }
    today = timezone.now().date()
    assert all(
        allocation.starts_on == today.replace(day=1) and allocation.is_current(timezone.now())
        for allocation in Allocation.objects.all()
    )
    pool = TenantPool.objects.get()
    assert (pool.tenant.slug, pool.gpu_seconds) == ("acme", 200 * 3600)


def test_the_demo_has_prices_per_cluster_from_the_first_of_the_month() -> None:
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)

    rates = {
        (rate.cluster.name, rate.gpu_type, str(rate.price_per_gpu_hour), rate.currency)
        for rate in Rate.objects.select_related("cluster")
    }
    assert rates == {
        ("local", "h100", "2.5000", "EUR"),
        ("local", "a100", "1.6000", "EUR"),
        ("local", "", "2.0000", "EUR"),
        ("north", "l40s", "1.1000", "EUR"),
        ("north", "", "1.1000", "EUR"),
    }
    first = timezone.now().date().replace(day=1)
    assert {rate.valid_from.date() for rate in Rate.objects.all()} == {first}
