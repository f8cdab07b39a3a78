"""`manage.py seed_demo` builds the demo through the services and is safe to run again."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.models import Rate
from jobs.models import ClusterAccount, JobTemplate
from quotas.models import Allocation, TenantPool
from tenants.models import AuditEvent, Project, ProjectMembership

pytestmark = pytest.mark.django_db


def test_seeding_twice_creates_everything_once() -> None:
    call_command("seed_demo", verbosity=0)
    events = AuditEvent.objects.count()

    call_command("seed_demo", verbosity=0)

    assert AuditEvent.objects.count() == events
    assert sorted(str(project) for project in Project.objects.all()) == ["acme/nlp", "acme/vision", "globex/genomics"]
    assert ProjectMembership.objects.count() == 4
    assert sorted(ClusterAccount.objects.values_list("username", flat=True)) == ["alice", "bob", "carol"]
    template = JobTemplate.objects.get()
    assert (str(template.project), template.name, template.gpus) == ("acme/vision", "Nightly evaluation", 2)


def test_the_demo_has_this_months_gpu_hours() -> None:
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)

    allocations = {
        (str(allocation.project), allocation.gpu_type): allocation.granted_gpu_seconds // 3600
        for allocation in Allocation.objects.select_related("project__tenant")
    }
    assert allocations == {("acme/vision", "h100"): 500, ("acme/nlp", "a100"): 100, ("globex/genomics", ""): 50}
    today = timezone.now().date()
    assert all(
        allocation.starts_on == today.replace(day=1) and allocation.is_current(timezone.now())
        for allocation in Allocation.objects.all()
    )
    pool = TenantPool.objects.get()
    assert (pool.tenant.slug, pool.gpu_seconds) == ("acme", 200 * 3600)


def test_the_demo_has_prices_from_the_first_of_the_month() -> None:
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)

    rates = {(rate.gpu_type, str(rate.price_per_gpu_hour), rate.currency) for rate in Rate.objects.all()}
    assert rates == {("h100", "2.5000", "EUR"), ("a100", "1.6000", "EUR"), ("", "2.0000", "EUR")}
    first = timezone.now().date().replace(day=1)
    assert {rate.valid_from.date() for rate in Rate.objects.all()} == {first}
