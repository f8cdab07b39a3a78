"""A job's page asks several questions of the same person (may they see it, cancel it, run it again): the roles
read when the job was loaded for them answer the later ones without another query, and the answers stay the
rule's own (tenant admin, project manager, member, viewer, the job's owner)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from jobs.models import Job, JobState
from jobs.selectors import JobAction, job_action_allowed, job_get_for_user
from tests.factories import add_project_member, add_tenant_member, make_job, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def job() -> Job:
    return make_job(state=JobState.PENDING, script="#!/bin/bash\ntrue\n")


def _person(job: Job, *, tenant_role: str = "member", project_role: str | None = None) -> Any:
    person = make_user()
    add_tenant_member(job.project.tenant, person, tenant_role)
    if project_role:
        add_project_member(job.project, person, project_role)
    return person


@pytest.mark.parametrize(
    ("tenant_role", "project_role", "may_cancel", "may_rerun"),
    [
        ("admin", None, True, False),
        ("member", "manager", True, True),
        ("member", "member", False, True),
        ("member", "viewer", False, False),
    ],
)
def test_the_later_questions_read_nothing_and_answer_by_the_rule(
    job: Job,
    django_assert_num_queries: Any,
    tenant_role: str,
    project_role: str | None,
    may_cancel: bool,
    may_rerun: bool,
) -> None:
    person = _person(job, tenant_role=tenant_role, project_role=project_role)
    loaded = job_get_for_user(user=person, job_id=job.pk)

    with django_assert_num_queries(0):
        assert job_action_allowed(user=person, job=loaded, action=JobAction.CANCEL) is may_cancel
        assert job_action_allowed(user=person, job=loaded, action=JobAction.RERUN) is may_rerun


def test_the_owner_may_cancel_without_a_role_that_manages(job: Job, django_assert_num_queries: Any) -> None:
    owner = job.user
    assert owner is not None
    loaded = job_get_for_user(user=owner, job_id=job.pk)

    with django_assert_num_queries(0):
        assert job_action_allowed(user=owner, job=loaded, action=JobAction.CANCEL)


def test_another_persons_question_reads_their_own_roles(job: Job, django_assert_num_queries: Any) -> None:
    """A job loaded for a manager does not lend the manager's roles to a viewer asking about it."""
    manager = _person(job, project_role="manager")
    viewer = _person(job, project_role="viewer")
    loaded = job_get_for_user(user=manager, job_id=job.pk)

    with django_assert_num_queries(1):
        assert not job_action_allowed(user=viewer, job=loaded, action=JobAction.CANCEL)
    with pytest.raises(PermissionDenied, match="Only the job's owner"):
        job_get_for_user(user=viewer, job_id=job.pk, action=JobAction.CANCEL)


def test_a_job_loaded_without_the_check_still_asks_the_database(job: Job, django_assert_num_queries: Any) -> None:
    manager = _person(job, project_role="manager")
    plain = Job.objects.select_related("project__tenant").get(pk=job.pk)

    with django_assert_num_queries(1):
        assert job_action_allowed(user=manager, job=plain, action=JobAction.CANCEL)
