"""Single sign-on in a real browser (Debian's Chromium) against the real demo OpenID provider: a newcomer signs
in through it, gets a portal account and lands on the dashboard; logging out signs them out there too. The whole
journey: a newcomer whose groups the directory maps is provisioned into her project and role and runs a job on
the local Slurm cluster from the browser (with the session's Celery worker and beat)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from playwright.sync_api import expect

from clusters.accounts import project_slurm_sync
from clusters.models import ClusterAccount, DirectoryPosixUsername
from clusters.slurm import SlurmClient
from jobs.models import Job, JobState
from tenants.models import AuditEvent, DirectoryGroupRole, Project, ProjectMembership, TenantMembership
from tests.conftest import celery_workers_idle, wait_until
from tests.factories import grant_allocation, make_project, make_tenant
from tests.frontend.conftest import Screenshots
from tests.jobs.conftest import _remove_from_slurm, local_cluster
from tests.oidc_provider import PASSWORD, DemoProvider

pytestmark = pytest.mark.django_db(transaction=True)

BUTTON = "Sign in with Demo identity provider"


def sign_in_at_the_provider(page: Any, provider: DemoProvider, username: str) -> None:
    page.wait_for_url(f"{provider.issuer}/interaction/**")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_a_newcomer_signs_in_through_the_provider_and_lands_on_the_dashboard(
    open_oidc_page: Callable[..., Any], oidc_portal: str, oidc_provider: DemoProvider, screenshot: Screenshots
) -> None:
    page = open_oidc_page(viewport="phone")
    page.goto("/jobs/")
    page.wait_for_url(f"{oidc_portal}/login/?next=/jobs/")
    screenshot(page, "login-page")

    page.get_by_role("button", name=BUTTON).click()
    screenshot(page, "provider-sign-in")
    sign_in_at_the_provider(page, oidc_provider, "dana")

    page.wait_for_url(f"{oidc_portal}/jobs/")
    page.goto("/")
    assert page.get_by_role("heading", name="Dashboard", level=1).is_visible()
    assert page.get_by_text("You are not in any project yet; ask your tenant admin to add you.").is_visible()
    screenshot(page, "dashboard")
    dana = get_user_model().objects.get(username="dana")
    assert (dana.email, dana.get_full_name()) == ("dana@example.org", "Dana Diaz")
    assert AuditEvent.objects.filter(action="user.created_by_sign_in", target_id=str(dana.pk)).count() == 1

    # Logging out goes on to the provider, which asks, signs her out there too and sends her back.
    page.set_viewport_size({"width": 1366, "height": 900})
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{oidc_provider.issuer}/session/end**")
    screenshot(page, "provider-sign-out")
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(f"{oidc_portal}/login/**")

    # Signed out at the provider as well: the next sign-in asks for her password again.
    page.get_by_role("button", name=BUTTON).click()
    page.wait_for_url(f"{oidc_provider.issuer}/interaction/**")
    screenshot(page, "provider-asks-again")


def test_an_answer_the_portal_did_not_ask_for_ends_on_the_refusal_page(
    open_oidc_page: Callable[..., Any], screenshot: Screenshots
) -> None:
    page = open_oidc_page()

    response = page.goto("/oidc/demo/login/callback/?code=made-up&state=made-up")

    assert response.status == 401
    assert page.get_by_role("heading", name="Sign-in refused", level=1).is_visible()
    assert (
        page.get_by_role("alert")
        .inner_text()
        .startswith("This answer from Demo identity provider does not belong to a sign-in started in this browser")
    )
    screenshot(page, "refused")
    page.get_by_role("link", name="Back to the login page").click()
    assert page.get_by_role("button", name=BUTTON).is_visible()
    assert not get_user_model().objects.exists()


@pytest.fixture
def directory_project(slurm_client: SlurmClient, oidc_provider: DemoProvider) -> Iterator[Project]:
    """A project with its Slurm account and GPU-hours on the local cluster, nobody in it, and the demo provider's
    directory mapped to it: `acme-vision-members` → member of the project, the `uid` claim → the POSIX user on the
    local cluster. dana's `uid` is `alice`, a POSIX user of this machine (the live fixtures run jobs as her)."""
    cluster = local_cluster()
    with transaction.atomic():
        tenant = make_tenant()
        project = make_project(tenant)
        grant_allocation(project, cluster)
        DirectoryGroupRole.objects.create(
            provider="demo",
            group="acme-vision-members",
            tenant_slug=tenant.slug,
            project_slug=project.slug,
            role="member",
        )
        DirectoryPosixUsername.objects.create(provider="demo", cluster=cluster, claim="uid")
    celery_workers_idle()
    project_slurm_sync(project_id=project.pk)
    oidc_provider.change_claims("dana", uid="alice")
    yield project
    oidc_provider.reset_claims()
    _remove_from_slurm(slurm_client, account=project.slurm_account, parent=tenant.slurm_parent_account)


@pytest.mark.cluster
def test_a_newcomer_from_the_directory_signs_in_and_runs_a_job_on_the_cluster(
    directory_project: Project,
    slurm_client: SlurmClient,
    celery_worker: str,
    celery_beat: None,
    open_oidc_page: Callable[..., Any],
    oidc_portal: str,
    oidc_provider: DemoProvider,
    screenshot: Screenshots,
) -> None:
    project, origin = directory_project, "directory:demo"
    label = f"{project.tenant.slug}/{project.slug}"
    page = open_oidc_page()
    page.goto("/")
    page.get_by_role("button", name=BUTTON).click()
    sign_in_at_the_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{oidc_portal}/")

    # Provisioned at this first sign-in: her account, the project's role and its tenant's, and her POSIX user,
    # all from the directory.
    expect(page.get_by_role("row", name=f"{label} Test project {project.slurm_account} Member")).to_be_visible()
    screenshot(page, "dashboard-with-the-project")
    dana = get_user_model().objects.get(username="dana")
    assert [(m.project, m.role, m.origin) for m in ProjectMembership.objects.filter(user=dana)] == [
        (project, "member", origin)
    ]
    assert [(m.tenant, m.role, m.origin) for m in TenantMembership.objects.filter(user=dana)] == [
        (project.tenant, "member", origin)
    ]
    account = ClusterAccount.objects.get(user=dana)
    assert (account.cluster.name, account.username) == ("local", "alice")

    # The worker brings the project's Slurm associations in line after the sign-in: alice may use its account.
    wait_until(
        lambda: "alice" in {a.user for a in slurm_client.associations(account=project.slurm_account, cluster="local")},
        timeout_seconds=60,
        what="alice's association with the project's Slurm account",
    )

    page.goto("/jobs/new/")
    page.get_by_role("link", name="GPU smoke test").click()
    page.wait_for_url("**template=gpu-smoke-test")
    assert page.get_by_label("Project").input_value() == label
    page.get_by_label("Name").fill("first job of dana")
    screenshot(page, "submit")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    assert page.get_by_text("Job “first job of dana” was accepted").is_visible()
    job = Job.objects.get(name="first job of dana")
    assert (job.project, job.user) == (project, dana)

    # In Slurm, as her POSIX user, under the project's account.
    in_slurm = {JobState.PENDING, JobState.RUNNING, JobState.COMPLETED}
    wait_until(lambda: Job.objects.get(pk=job.pk).state in in_slurm, timeout_seconds=120, what="the job in Slurm")
    job.refresh_from_db()
    assert job.slurm_job_id is not None
    slurm_job = slurm_client.get_job(job_id=job.slurm_job_id)
    assert (slurm_job.account, slurm_job.user_name) == (project.slurm_account, "alice")
    page.reload()
    expect(page.locator("#job-state")).to_have_text(re.compile("^(Pending|Running|Completed)$"))
    screenshot(page, "job-in-slurm")
