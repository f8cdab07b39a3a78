"""The jobs pages through Django's test client: the submit form, its estimate and its errors, the list with
its filters and pages, a job's page for each role, and cancelling."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.rates import rate_create
from clusters.models import Cluster, ClusterAccount, GpuType, Partition
from jobs.job_services import JobRequest, job_cancel, job_submit
from jobs.models import Job, JobState, JobTemplate
from quotas.models import Allocation
from tenants.models import Project
from tests.factories import (
    add_project_member,
    grant_allocation,
    make_matrix_cluster,
    make_project,
    make_tenant,
    make_user,
)

pytestmark = pytest.mark.django_db


@dataclass
class Shop:
    cluster: Cluster
    project: Project
    allocation: Allocation
    users: dict[str, User]

    def client(self, role: str) -> Client:
        client = Client()
        client.force_login(self.users[role])
        return client

    def submit(self, name: str = "job", user: str = "member") -> Job:
        job, _ = job_submit(
            user=self.users[user],
            project=self.project,
            request=JobRequest(cluster="pagecluster", name=name, script="#!/bin/bash\necho hi\n"),
        )
        return job


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    return make_shop(tmp_path)


def make_shop(tmp_path: Path) -> Shop:
    """A tenant's project on a priced cluster with a user in each role, and an outsider of another tenant."""
    cluster = make_matrix_cluster("pagecluster")
    cluster.log_root = str(tmp_path)
    cluster.save(update_fields=["log_root"])
    users = {role: make_user(f"p-{role}") for role in ("member", "manager", "viewer", "tenant_admin", "outsider")}
    users["staff"] = make_user("p-staff", is_staff=True)
    tenant = make_tenant("acme", admin=users["tenant_admin"])
    project = make_project(tenant, "vision")
    for role in ("member", "manager", "viewer"):
        add_project_member(project, users[role], role)
    make_tenant("othercorp", admin=users["outsider"])
    for index, role in enumerate(("member", "manager", "staff")):
        ClusterAccount.objects.create(cluster=cluster, user=users[role], username=f"page{index}")
    allocation = grant_allocation(project, cluster, 500)
    rate_create(
        actor=None,
        cluster=cluster,
        gpu_type="",
        price_per_gpu_hour=Decimal("2.50"),
        currency="EUR",
        valid_from=timezone.now() - timedelta(days=1),
    )
    return Shop(cluster=cluster, project=project, allocation=allocation, users=users)


def _form(**fields: str) -> dict[str, str]:
    return {
        "project": "acme/vision",
        "cluster": "pagecluster",
        "partition": "gpu",
        "gpu_type": "h100",
        "gpus": "2",
        "time_limit_minutes": "240",
        "name": "train",
        # As browsers send a textarea: CRLF line breaks.
        "script": "#!/bin/bash\r\necho train\r\n",
        "environment": "EPOCHS=3\r\n",
        **fields,
    }


def _field_error(html: str, field: str) -> str:
    """The text of the error shown beside `field`, checking that the field points at it."""
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', html) or re.search(
        rf'aria-invalid="true"[^>]*name="{field}"', html
    ), f"{field} is not marked invalid"
    match = re.search(rf'<div class="field-error" id="error-{field}">(.*?)</div>', html, re.S)
    assert match, f"no error beside {field}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


# Submit ------------------------------------------------------------------------------------------------


def test_the_form_offers_the_projects_one_may_submit_to_and_their_templates(shop: Shop) -> None:
    saved = JobTemplate.objects.create(
        project=shop.project,
        name="nightly eval",
        description="Evaluates the last checkpoint",
        script="#!/bin/bash\necho nightly\n",
        gpus=3,
        time_limit_minutes=90,
        environment={"MODEL": "big"},
    )
    html = shop.client("member").get("/jobs/new/").content.decode()
    assert '<option value="acme/vision" selected>acme/vision' in html
    # Each cluster is offered with its Slurm release and health as the workers last saw them.
    assert (
        '<option value="pagecluster" selected>pagecluster · not answering: jobs wait until it is back</option>' in html
    )
    cluster = Cluster.objects.get(name="pagecluster")
    Cluster.objects.filter(pk=cluster.pk).update(last_ping_ok=True, slurm_release="24.11.5")
    free = sum(gpu.gpus_total - gpu.gpus_used for gpu in GpuType.objects.filter(cluster=cluster))
    html = shop.client("member").get("/jobs/new/").content.decode()
    assert f'<option value="pagecluster" selected>pagecluster · Slurm 24.11.5 · {free} GPUs free</option>' in html
    assert '<option value="gpu" selected>gpu (default) · up to 600 min</option>' in html
    assert "GPU smoke test" in html
    assert f'template={saved.pk}">nightly eval</a>' in html
    assert "#!/bin/bash\n# Runs in the job&#x27;s own directory" in html

    prefilled = shop.client("member").get(f"/jobs/new/?project=acme/vision&template={saved.pk}").content.decode()
    assert '<textarea id="id_script" name="script"' in prefilled
    assert "#!/bin/bash\necho nightly\n</textarea>" in prefilled
    assert 'name="gpus" type="number" inputmode="numeric" min="1" step="1" value="3"' in prefilled
    assert 'value="90"' in prefilled
    assert ">MODEL=big</textarea>" in prefilled
    assert f'<input type="hidden" name="template" value="{saved.pk}">' in prefilled

    missing = shop.client("member").get("/jobs/new/?template=no-such").content.decode()
    assert "There is no template “no-such” for acme/vision; the form starts from scratch." in missing


def test_viewers_get_an_empty_state_instead_of_the_form(shop: Shop) -> None:
    html = shop.client("viewer").get("/jobs/new/").content.decode()
    assert "You cannot submit jobs yet." in html
    assert "acme/vision" not in html
    assert 'name="script"' not in html


def test_the_estimate_says_what_the_job_costs_at_most_and_what_it_leaves(shop: Shop) -> None:
    until = shop.allocation.ends_on.isoformat()
    response = shop.client("member").post("/jobs/new/estimates/", _form())
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        "At most 8.00 GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to 20.00 EUR; "
        f"leaves 492.00 of 500.00 GPU-hours until {until}."
    ) in html
    assert 'data-fits="true"' in html
    assert "does not fit" not in html

    too_big = shop.client("viewer").post("/jobs/new/estimates/", _form(gpus="4", time_limit_minutes="600"))
    text = too_big.content.decode()
    assert "At most 40.00 GPU-hours on h100 at 2.5000 EUR/GPU-hour: up to 100.00 EUR; leaves 460.00" in text

    shop.allocation.granted_gpu_seconds = 4 * 3600
    shop.allocation.save(update_fields=["granted_gpu_seconds"])
    warning = shop.client("member").post("/jobs/new/estimates/", _form()).content.decode()
    assert 'data-fits="false"' in warning
    assert "but it would be refused: This job needs 8.0 GPU-hours" in warning
    assert "<strong>This job does not fit.</strong>" in warning

    invalid = shop.client("member").post("/jobs/new/estimates/", _form(gpus="9")).content.decode()
    assert "No estimate until the form is fixed:" in invalid
    assert "ask for 4 or fewer" in invalid


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "gpus",
            "9",
            "`gpus` counts the GPUs on each node, and the nodes of partition 'gpu' have at most 4 h100 GPUs; ask "
            "for 4 or fewer per node, and for more nodes (`nodes`) if you need more GPUs.",
        ),
        ("gpus", "0", "Ask for at least 1 GPU."),
        (
            "time_limit_minutes",
            "601",
            "Partition 'gpu' allows at most 600 minutes (10 h); ask for less or use another partition.",
        ),
        ("partition", "nope", "Cluster 'pagecluster' has no partition 'nope'; choose one of: gpu."),
        ("gpus", "two", "Enter a whole number."),
        (
            "script",
            "echo no shebang",
            "Start the script with an interpreter line such as '#!/bin/bash': Slurm requires one.",
        ),
        ("environment", "JUST_A_NAME", "Line 1: write NAME=value."),
    ],
)
def test_errors_appear_beside_the_field_they_concern_and_nothing_is_stored(
    shop: Shop, field: str, value: str, message: str
) -> None:
    response = shop.client("member").post("/jobs/new/", _form(**{field: value}))
    assert response.status_code == 200
    html = response.content.decode()
    assert _field_error(html, field) == message.replace("'", "&#x27;")
    assert "The job was not submitted: fix the fields marked below." in html
    # What the user wrote is kept.
    assert "#!/bin/bash\r\necho train\r\n</textarea>" in html or field == "script"
    assert Job.objects.count() == 0


def test_a_job_beyond_the_quota_is_refused_with_the_reason_and_not_stored(shop: Shop) -> None:
    shop.allocation.granted_gpu_seconds = 3600
    shop.allocation.save(update_fields=["granted_gpu_seconds"])
    html = shop.client("member").post("/jobs/new/", _form()).content.decode()
    errors = re.search(r'<div class="form-errors" role="alert">(.*?)</div>', html, re.S)
    assert errors is not None
    assert "This job needs 8.0 GPU-hours (2 GPUs x 240 min); vision has 1.0 GPU-hours left" in errors.group(1)
    assert Job.objects.count() == 0


def test_a_submission_goes_to_the_new_jobs_page_with_a_message(shop: Shop) -> None:
    client = shop.client("member")
    response = client.post("/jobs/new/", _form())
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert (job.name, job.partition, job.gpu_type, job.gpus, job.time_limit_minutes) == ("train", "gpu", "h100", 2, 240)
    assert job.environment == {"EPOCHS": "3"}
    assert job.script == "#!/bin/bash\necho train\n"
    assert job.user == shop.users["member"]
    page = client.get(response["Location"]).content.decode()
    assert "Job “train” was accepted; a worker is handing it to pagecluster." in page
    assert "8.00 GPU-hours" in page
    assert "up to 20.00 EUR" in page


def test_a_multi_node_job_from_the_form_shows_its_total_and_is_checked_against_the_nodes(shop: Shop) -> None:
    Partition.objects.filter(cluster=shop.cluster).update(node_names=["n1", "n2"], gpu_nodes_by_type={"h100": 2})
    client = shop.client("member")

    estimate = client.post("/jobs/new/estimates/", _form(nodes="2")).content.decode()
    too_many = client.post("/jobs/new/", _form(nodes="3")).content.decode()
    response = client.post("/jobs/new/", _form(nodes="2"))

    times = "\N{MULTIPLICATION SIGN}"
    assert f'<p class="estimate-total" id="estimate-total">4 GPUs in all: 2 nodes {times} 2 GPUs.</p>' in estimate
    assert "At most 16.00 GPU-hours (2 nodes x 2 GPUs) on h100" in estimate
    assert _field_error(too_many, "nodes") == (
        "Partition &#x27;gpu&#x27; has 2 nodes with h100 GPUs; ask for 2 or fewer nodes, or choose a partition with "
        "more."
    )
    job = Job.objects.get()
    assert (job.node_count, job.gpus, job.total_gpus) == (2, 2, 4)
    page = client.get(response["Location"]).content.decode()
    assert f'<dd id="job-gpus">4 in all: 2 nodes {times} 2 {times} h100</dd>' in page
    form = client.get(f"/jobs/new/?rerun={job.pk}").content.decode()
    assert re.search(r'id="id_nodes" name="nodes"[^>]*value="2"', form)


def test_a_template_submission_records_the_template(shop: Shop) -> None:
    shop.client("manager").post("/jobs/new/", _form(template="gpu-smoke-test", gpus="1", time_limit_minutes="5"))
    assert Job.objects.get().template_id == "gpu-smoke-test"


def test_viewers_cannot_submit_even_by_posting(shop: Shop) -> None:
    response = shop.client("viewer").post("/jobs/new/", _form())
    assert response.status_code == 403
    assert Job.objects.count() == 0


# The list -----------------------------------------------------------------------------------------------


def test_the_list_pages_by_25_by_cursor_and_keeps_the_filters_in_the_links(shop: Shop) -> None:
    for number in range(27):
        shop.submit(name=f"sweep-{number:02d}")
    client = shop.client("viewer")
    first = client.get("/jobs/").content.decode()
    assert first.count("<tr data-job-id=") == 25
    assert '<span class="current">27 jobs</span>' in first
    assert 'rel="prev"' not in first
    assert first.index("sweep-26") < first.index("sweep-02")
    older = re.search(r'<a href="\?cursor=([\w-]+)" rel="next">Older →</a>', first)
    assert older is not None
    second = client.get(f"/jobs/?cursor={older.group(1)}").content.decode()
    assert second.count("<tr data-job-id=") == 2
    assert "sweep-00" in second
    assert "sweep-01" in second
    assert 'rel="next"' not in second
    newer = re.search(r'<a href="\?cursor=([\w-]+)" rel="prev">← Newer</a>', second)
    assert newer is not None
    back = client.get(f"/jobs/?cursor={newer.group(1)}").content.decode()
    assert back.count("<tr data-job-id=") == 25
    assert back.index("sweep-26") < back.index("sweep-02")
    assert 'rel="prev"' not in back  # the newest page again: no newer one
    assert client.get("/jobs/?cursor=not-a-cursor").content.decode().count("<tr data-job-id=") == 25

    filtered = client.get("/jobs/?search=sweep-1&project=acme/vision").content.decode()
    assert filtered.count("<tr data-job-id=") == 10
    assert "Clear filters" in filtered


def test_a_search_counts_the_recent_matches_only_and_pages_on_to_older_ones(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = [shop.submit(name=f"sweep-{number:02d}") for number in range(30)]
    # Three were submitted two months ago: older than the week a search looks within first.
    Job.objects.filter(pk__in=[job.pk for job in jobs[:3]]).update(created_at=timezone.now() - timedelta(days=60))
    client = shop.client("viewer")
    first = client.get("/jobs/?search=sweep").content.decode()
    assert first.count("<tr data-job-id=") == 25
    assert '<span class="current">at least 27 jobs</span>' in first  # reading every match would grow with history
    older = re.search(r'<a href="\?search=sweep&amp;cursor=([\w-]+)" rel="next">Older →</a>', first)
    assert older is not None
    second = client.get(f"/jobs/?search=sweep&cursor={older.group(1)}").content.decode()
    assert [f"sweep-{number:02d}" in second for number in range(5)] == [True] * 5
    assert second.count("<tr data-job-id=") == 5
    monkeypatch.setattr("portal.keyset.COUNT_LIMIT", 26)
    assert '<span class="current">more than 26 jobs</span>' in client.get("/jobs/?search=sweep").content.decode()


def test_the_list_counts_up_to_a_limit_then_says_more_than(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    for number in range(4):
        shop.submit(name=f"sweep-{number:02d}")
    client = shop.client("viewer")
    monkeypatch.setattr("frontend.job_views.JOBS_PER_PAGE", 2)
    assert '<span class="current">4 jobs</span>' in client.get("/jobs/").content.decode()
    monkeypatch.setattr("portal.keyset.COUNT_LIMIT", 3)
    assert '<span class="current">more than 3 jobs</span>' in client.get("/jobs/").content.decode()


def test_the_list_filters_by_state_and_cluster(shop: Shop) -> None:
    kept = shop.submit(name="kept")
    dropped = shop.submit(name="dropped")
    job_cancel(user=shop.users["member"], job=dropped)
    client = shop.client("member")
    cancelled = client.get("/jobs/?state=cancelled").content.decode()
    assert f'data-job-id="{dropped.pk}"' in cancelled
    assert f'data-job-id="{kept.pk}"' not in cancelled
    assert '<span class="badge badge-cancelled" data-field="state">Cancelled</span>' in cancelled
    active = client.get("/jobs/?state=active").content.decode()
    assert f'data-job-id="{kept.pk}"' in active
    assert f'data-job-id="{dropped.pk}"' not in active
    none = client.get("/jobs/?cluster=elsewhere").content.decode()
    assert "No jobs match these filters." in none
    # The page watches its projects live.
    assert '"/ws/projects/acme/vision/jobs/"' in active


def test_the_list_is_empty_for_newcomers_and_points_to_submit(shop: Shop) -> None:
    client = Client()
    client.force_login(make_user("newcomer"))
    html = client.get("/jobs/").content.decode()
    assert "No jobs yet." in html
    assert '<a class="button" href="/jobs/new/">Submit your first job</a>' in html
    shop.submit()
    assert "acme/vision" not in shop.client("outsider").get("/jobs/").content.decode()


# One job ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "status", "may_cancel"),
    [
        ("member", 200, True),
        ("manager", 200, True),
        ("tenant_admin", 200, True),
        ("staff", 200, True),
        ("viewer", 200, False),
        ("outsider", 404, False),
    ],
)
def test_the_job_page_for_each_role(shop: Shop, role: str, status: int, may_cancel: bool) -> None:
    job = shop.submit(name="probe")
    response = shop.client(role).get(f"/jobs/{job.pk}/")
    assert response.status_code == status
    html = response.content.decode()
    assert ("Cancel this job…" in html) is may_cancel
    if status == 200:
        assert '<span class="badge badge-queued" id="job-state">Queued</span>' in html
        assert "accepted</td>" in html
        assert f'href="/jobs/{job.pk}/output/stderr/" download' in html
        assert f'"/ws/jobs/{job.pk}/log/"' in html
        assert 'data-stream="stdout" aria-pressed="true"' in html
    else:
        assert "probe" not in html


def test_a_viewer_cannot_cancel_and_nothing_changes(shop: Shop) -> None:
    job = shop.submit()
    response = shop.client("viewer").post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.cancel_requested_at is None


def test_the_owner_cancels_from_the_page_and_a_second_cancel_says_why_not(shop: Shop) -> None:
    job = shop.submit()
    client = shop.client("member")
    response = client.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "The job was cancelled before it reached Slurm." in page
    assert "Cancel this job…" not in page
    assert "cancelled by p-member before it reached Slurm" in page
    again = client.post(f"/jobs/{job.pk}/cancel/", follow=True).content.decode()
    assert "The job has already ended (cancelled); nothing to cancel." in again
