"""`manage.py seed_demo` builds the demo through the services and is safe to run again."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from jobs.models import ClusterAccount, JobTemplate
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
