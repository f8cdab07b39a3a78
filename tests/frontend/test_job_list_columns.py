"""The jobs list's columns, filters and sorts kept in the URL, and a job's page with its script, its cost so
far and who cancelled it and why (pages and the REST API), through Django's test client."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape
from rest_framework.test import APIClient

from billing.job_costs import job_costs
from clusters.models import ClusterAccount
from jobs.job_services import JobRequest, job_cancel, job_submit
from jobs.models import Job, JobState
from jobs.pipelines import NEVER_SATISFIED_REASON
from tenants.models import AuditEvent, Tenant
from tests.factories import grant_allocation, make_project
from tests.frontend.test_job_pages import Shop, make_shop

pytestmark = pytest.mark.django_db

STARTED = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    return make_shop(tmp_path)


def _html(client: Client, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.content.decode()[:2000]
    return response.content.decode()


def _row(html: str, job: Job) -> str:
    match = re.search(rf'<tr data-job-id="{job.pk}">(.*?)</tr>', html, re.S)
    assert match, f"no row for {job.name}"
    return match.group(1)


def _cell(row: str, field: str) -> str:
    match = re.search(rf'<td[^>]*data-field="{field}"[^>]*>(.*?)</td>', row, re.S)
    assert match, f"no {field} cell"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def _names(html: str) -> list[str]:
    return re.findall(r'<th scope="row"><a href="/jobs/[0-9a-f-]+/">([^<]+)</a>', html)


def _set(job: Job, **fields: object) -> Job:
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


def _running(shop: Shop, name: str, *, minutes: int, gpus: int = 1, nodes: int = 1, user: str = "member") -> Job:
    job = shop.submit(name=name, user=user)
    now = timezone.now()
    return _set(
        job,
        state=JobState.RUNNING,
        gpus=gpus,
        node_count=nodes,
        gpu_type="h100",
        slurm_job_id=1000 + minutes,
        started_at=now - timedelta(minutes=minutes),
    )


def _ended(shop: Shop, name: str, *, minutes: int, exit_code: int, user: str = "member") -> Job:
    job = shop.submit(name=name, user=user)
    return _set(
        job,
        state=JobState.COMPLETED if exit_code == 0 else JobState.FAILED,
        started_at=STARTED,
        ended_at=STARTED + timedelta(minutes=minutes),
        exit_code=exit_code,
    )


# Columns ------------------------------------------------------------------------------------------------


def test_the_list_shows_owner_gpus_duration_cost_and_exit_code(shop: Shop) -> None:
    running = _running(shop, "wide", minutes=90, gpus=4, nodes=2)
    done = _ended(shop, "short", minutes=75, exit_code=3, user="manager")
    queued = shop.submit(name="waiting")
    html = _html(shop.client("viewer"), "/jobs/")
    for header in ("Owner", "GPUs", "Submitted", "Duration", "Cost", "Exit code"):
        assert re.search(rf'<th scope="col"[^>]*><a href="[^"]*">{header}', html), header

    row = _row(html, running)
    assert _cell(row, "owner") == "p-member"
    assert _cell(row, "gpus") == "8 \N{MULTIPLICATION SIGN} h100 (2 nodes \N{MULTIPLICATION SIGN} 4)"  # all its GPUs
    assert re.fullmatch(r"1:30:\d\d", _cell(row, "duration"))
    # The running rate rides on the cell, so the page counts the cost up: 8 GPUs x 1.5 h x 2.50 EUR = 30.00 so far.
    started = running.started_at.isoformat() if running.started_at else ""
    assert (
        f'data-field="cost" data-price="2.5000" data-gpus="8" data-currency="EUR" data-places="2" '
        f'data-started-at="{started}"' in row
    )
    assert re.fullmatch(r"30\.0\d EUR", _cell(row, "cost"))
    assert _cell(row, "exit_code") == "—"

    row = _row(html, done)
    assert _cell(row, "owner") == "p-manager"
    assert _cell(row, "duration") == "1:15:00"
    assert 'data-ended-at="2026-11-02T09:15:00+00:00"' in row
    assert _cell(row, "cost") == "—"  # not priced from Slurm's accounting yet
    assert _cell(row, "exit_code") == "3"

    row = _row(html, queued)
    assert _cell(row, "duration") == "—"
    assert _cell(row, "cost") == "—"
    assert 'data-price="2.5000"' in row  # counts from when it starts, at the rate in force


def test_a_running_jobs_cost_so_far_is_its_gpu_hours_at_the_running_rate(shop: Shop) -> None:
    job = _running(shop, "wide", minutes=0, gpus=4, nodes=2)
    assert job.started_at is not None
    cost = job_costs([job], now=job.started_at + timedelta(hours=1, minutes=30))[job.pk]
    assert (cost.amount, cost.currency, cost.price_per_gpu_hour, cost.live) == (
        Decimal("30.00"),
        "EUR",
        Decimal("2.5000"),
        True,
    )
    # 8 GPUs for 1 s at 2.50 EUR/GPU-hour is 0.0056 EUR: rounded half up to the cent, as an invoice rounds it.
    assert job_costs([job], now=job.started_at + timedelta(seconds=1))[job.pk].amount == Decimal("0.01")


# Filters, sorting and the URL ---------------------------------------------------------------------------


def test_the_list_filters_by_owner_and_submission_dates(shop: Shop) -> None:
    mine = shop.submit(name="mine")
    theirs = shop.submit(name="theirs", user="manager")
    old = _set(shop.submit(name="old"), created_at=datetime(2026, 10, 30, 23, 59, tzinfo=UTC))
    early = _set(shop.submit(name="first-day"), created_at=datetime(2026, 11, 1, 0, 0, tzinfo=UTC))
    late = _set(shop.submit(name="last-day"), created_at=datetime(2026, 11, 3, 23, 59, tzinfo=UTC))
    client = shop.client("viewer")

    owned = _html(client, "/jobs/?owner=P-Manager")
    assert _names(owned) == [theirs.name]
    assert 'name="owner" type="text" value="P-Manager"' in owned

    between = _html(client, "/jobs/?submitted_from=2026-11-01&submitted_to=2026-11-03")
    assert _names(between) == [late.name, early.name]  # both days whole, UTC
    assert 'name="submitted_from" type="date" value="2026-11-01"' in between
    assert old.name not in _names(between)
    assert mine.name in _names(_html(client, "/jobs/?owner=p-member"))


def test_an_owner_filter_naming_another_tenants_user_shows_nothing_of_theirs(shop: Shop) -> None:
    other_project = make_project(Tenant.objects.get(slug="othercorp"), "secret")
    ClusterAccount.objects.create(cluster=shop.cluster, user=shop.users["outsider"], username="pageout")
    grant_allocation(other_project, shop.cluster, 100)
    foreign, _ = job_submit(
        user=shop.users["outsider"],
        project=other_project,
        request=JobRequest(cluster="pagecluster", name="othercorp-secret-run", script="#!/bin/bash\n"),
    )
    assert Job.objects.filter(user=shop.users["outsider"]).count() == 1
    for role in ("member", "manager", "tenant_admin", "viewer"):
        html = _html(shop.client(role), "/jobs/?owner=p-outsider")
        assert "othercorp-secret-run" not in html
        assert str(foreign.pk) not in html
        assert "No jobs match these filters." in html
        assert '<a href="/jobs/">clear the filters</a>' in html
    # Its owner sees it with the same filter.
    assert _names(_html(shop.client("outsider"), "/jobs/?owner=p-outsider")) == ["othercorp-secret-run"]


def test_the_list_sorts_by_duration_cost_gpus_and_owner(shop: Shop) -> None:
    long = _ended(shop, "long", minutes=120, exit_code=0)
    brief = _ended(shop, "brief", minutes=5, exit_code=1, user="manager")
    running = _running(shop, "running", minutes=30, gpus=4)
    queued = shop.submit(name="queued")
    client = shop.client("viewer")

    assert _names(_html(client, "/jobs/?sort=-duration")) == [long.name, running.name, brief.name, queued.name]
    assert _names(_html(client, "/jobs/?sort=duration")) == [brief.name, running.name, long.name, queued.name]
    # Cost: the running job's so far (4 GPUs x 0.5 h x 2.50 = 5.00 EUR); unpriced ones last.
    assert _names(_html(client, "/jobs/?sort=-cost"))[0] == running.name
    assert _names(_html(client, "/jobs/?sort=-gpus"))[0] == running.name
    by_owner = _names(_html(client, "/jobs/?sort=-owner"))
    assert by_owner[0] == long.name or by_owner[0] in (running.name, queued.name)  # p-member after p-manager
    assert by_owner[-1] == brief.name
    assert _names(_html(client, "/jobs/?sort=exit_code"))[:2] == [long.name, brief.name]


def test_sort_links_keep_the_filters_and_reverse_the_current_sort(shop: Shop) -> None:
    shop.submit(name="one")
    html = _html(shop.client("viewer"), "/jobs/?state=queued&owner=p-member&sort=-duration")
    header = re.search(r'<th scope="col" class="number" aria-sort="descending"><a href="([^"]+)">Duration', html)
    assert header, "the duration column is not marked as the sort"
    reverse = parse_qs(urlparse(header.group(1).replace("&amp;", "&")).query)
    assert reverse == {"state": ["queued"], "owner": ["p-member"], "sort": ["duration"]}
    cost = re.search(r'<a href="([^"]+)">Cost', html)
    assert cost
    assert parse_qs(urlparse(cost.group(1).replace("&amp;", "&")).query)["sort"] == ["-cost"]
    assert '<option value="-duration" selected>Longest running</option>' in html
    assert '<option value="queued" selected>Queued</option>' in html


def test_pages_in_another_order_go_by_number_and_keep_filters_and_sort(shop: Shop) -> None:
    for number in range(27):
        _set(shop.submit(name=f"sweep-{number:02d}"), gpus=1 + number % 3)
    client = shop.client("viewer")
    first = _html(client, "/jobs/?owner=p-member&sort=gpus")
    assert first.count("<tr data-job-id=") == 25
    following = re.search(r'<a href="\?([^"]+)" rel="next">Next →</a>', first)
    assert following
    query = parse_qs(following.group(1).replace("&amp;", "&"))
    assert query == {"owner": ["p-member"], "sort": ["gpus"], "page": ["2"]}
    second = _html(client, "/jobs/?" + following.group(1).replace("&amp;", "&"))
    assert second.count("<tr data-job-id=") == 2
    assert set(_names(first)).isdisjoint(_names(second))
    back = re.search(r'<a href="\?([^"]+)" rel="prev">← Previous</a>', second)
    assert back
    assert parse_qs(back.group(1).replace("&amp;", "&"))["page"] == ["1"]


def test_another_order_sorts_the_newest_jobs_only_and_says_so_when_there_are_more(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    for number in range(6):
        _set(shop.submit(name=f"sweep-{number:02d}"), gpus=1 + number)  # the oldest have the fewest GPUs
    client = shop.client("viewer")
    every = _html(client, "/jobs/?sort=gpus")
    assert _names(every)[0] == "sweep-00"
    assert 'id="sorted-among"' not in every
    monkeypatch.setattr("frontend.job_views.SORT_LIMIT", 4)
    monkeypatch.setattr("portal.keyset.COUNT_LIMIT", 4)
    newest = _html(client, "/jobs/?sort=gpus")
    assert _names(newest) == ["sweep-02", "sweep-03", "sweep-04", "sweep-05"]
    assert "among the newest 4 jobs that match: filter by project, state or the dates submitted" in newest
    # Oldest first is the list's own order, whole, however long.
    assert _names(_html(client, "/jobs/?sort=submitted"))[0] == "sweep-00"


def test_oldest_first_pages_by_cursor(shop: Shop) -> None:
    for number in range(27):
        shop.submit(name=f"sweep-{number:02d}")
    client = shop.client("viewer")
    first = _html(client, "/jobs/?sort=submitted")
    assert _names(first)[:2] == ["sweep-00", "sweep-01"]
    assert len(_names(first)) == 25
    following = re.search(r'<a href="\?sort=submitted&amp;cursor=([\w-]+)" rel="next">Newer →</a>', first)
    assert following
    second = _html(client, f"/jobs/?sort=submitted&cursor={following.group(1)}")
    assert _names(second) == ["sweep-25", "sweep-26"]
    back = re.search(r'<a href="\?sort=submitted&amp;cursor=([\w-]+)" rel="prev">← Older</a>', second)
    assert back
    assert _names(_html(client, f"/jobs/?sort=submitted&cursor={back.group(1)}")) == _names(first)


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("state=exploded", "state", "'exploded' is not a state; choose one from the list."),
        ("submitted_from=2026-13-01", "submitted_from", "Write the date as YYYY-MM-DD, e.g. 2026-11-01."),
        ("submitted_to=yesterday", "submitted_to", "Write the date as YYYY-MM-DD, e.g. 2026-11-01."),
        (
            "submitted_from=2026-11-05&submitted_to=2026-11-01",
            "submitted_to",
            "The end of the range is before its start.",
        ),
        ("project=othercorp/secret", "project", "You have no project 'othercorp/secret'; choose one from the list."),
        ("project=no-slash", "project", "You have no project 'no-slash'; choose one from the list."),
        (
            "sort=price",
            "sort",
            "'price' is not a sort; sort by submitted, duration, cost, gpus, owner, exit_code (a leading - for "
            "descending).",
        ),
    ],
)
def test_a_filter_it_cannot_read_is_a_message_beside_its_field_not_a_wider_list(
    shop: Shop, query: str, field: str, message: str
) -> None:
    shop.submit(name="hidden-while-wrong")
    html = _html(shop.client("member"), f"/jobs/?{query}", status=400)
    assert f'<div class="field-error" id="error-{field}"><p>{escape(message)}</p></div>' in html
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', html)
    assert "These filters cannot be read; fix them to see jobs." in html
    assert "hidden-while-wrong" not in html
    assert '<a href="/jobs/">Clear filters</a>' in html


# A job's page -------------------------------------------------------------------------------------------


def test_the_job_page_shows_the_script_and_environment_as_submitted_escaped(shop: Shop) -> None:
    job, _ = job_submit(
        user=shop.users["member"],
        project=shop.project,
        request=JobRequest(
            cluster="pagecluster",
            name="escaped",
            script="#!/bin/bash\necho '<script>alert(1)</script>' && true\n",
            environment={"EPOCHS": "3", "NOTE": "<b>bold</b>"},
        ),
    )
    html = _html(shop.client("viewer"), f"/jobs/{job.pk}/")
    assert (
        '<pre class="job-script" tabindex="0"><code>#!/bin/bash\n'
        "echo &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27; &amp;&amp; true\n</code></pre>"
    ) in html
    assert "<script>alert(1)</script>" not in html
    assert "<code>EPOCHS=3\nNOTE=&lt;b&gt;bold&lt;/b&gt;\n</code>" in html


def test_a_running_jobs_page_counts_its_cost_up_and_an_ended_one_shows_its_duration(shop: Shop) -> None:
    running = _running(shop, "wide", minutes=60, gpus=2)
    html = _html(shop.client("viewer"), f"/jobs/{running.pk}/")
    assert "<dt>Cost so far</dt>" in html
    assert re.search(r'<dd data-field="cost" data-price="2.5000" data-gpus="2"[^>]*>5\.0\d EUR</dd>', html)
    assert re.search(r'<dd data-field="duration" data-started-at="[^"]+">1:00:\d\d</dd>', html)
    done = _ended(shop, "done", minutes=61, exit_code=0)
    assert '<dd data-field="duration">1:01:00</dd>' in _html(shop.client("viewer"), f"/jobs/{done.pk}/")


def test_the_job_page_links_to_pages_not_to_the_api(shop: Shop) -> None:
    job = shop.submit(name="links")
    html = _html(shop.client("member"), f"/jobs/{job.pk}/")
    assert 'href="/api/' not in html.replace('href="/api/docs/"', "")
    assert f'href="/jobs/{job.pk}/output/stdout/" download' in html


def test_the_output_download_sends_the_file_or_says_why_on_the_job_page(shop: Shop) -> None:
    job = shop.submit(name="output")
    client = shop.client("viewer")
    missing = client.get(f"/jobs/{job.pk}/output/stdout/", follow=True)
    assert missing.redirect_chain == [(f"/jobs/{job.pk}/#log-viewer", 302)]
    assert "The job has not written any output yet (no stdout file); it is queued." in missing.content.decode()
    Path(job.stdout_path).parent.mkdir(parents=True, exist_ok=True)
    Path(job.stdout_path).write_bytes(b"hello from the job\n")
    response = client.get(f"/jobs/{job.pk}/output/stdout/")
    assert response.status_code == 200
    assert response.content == b"hello from the job\n"  # a small file: one buffered answer
    assert response["Content-Disposition"].startswith("attachment;")
    assert client.get(f"/jobs/{job.pk}/output/environ/").status_code == 404
    assert client.get(f"/jobs/{job.pk}/output/..%2f..%2f..%2fetc%2fpasswd/").status_code == 404
    assert shop.client("outsider").get(f"/jobs/{job.pk}/output/stdout/").status_code == 404


# Who cancelled, and why ---------------------------------------------------------------------------------


def test_cancelling_from_the_page_keeps_who_and_why_in_the_page_and_the_audit_log(shop: Shop) -> None:
    job = shop.submit(name="doomed")
    client = shop.client("manager")
    form = _html(client, f"/jobs/{job.pk}/")
    assert '<textarea id="cancel-reason" name="reason" rows="2" maxlength="500"></textarea>' in form
    response = client.post(f"/jobs/{job.pk}/cancel/", {"reason": "  wrong <dataset>  "})
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_by, job.cancel_reason) == (
        JobState.CANCELLED,
        shop.users["manager"],
        "wrong <dataset>",
    )
    html = _html(shop.client("viewer"), f"/jobs/{job.pk}/")
    assert (
        '<dt>Cancelled by</dt><dd id="job-cancelled-by">p-manager, because: '
        '<q id="job-cancel-reason">wrong &lt;dataset&gt;</q></dd>'
    ) in html
    event = AuditEvent.objects.get(action="job.cancel", target_id=str(job.pk))
    assert (event.actor, event.after) == (
        shop.users["manager"],
        {"state": "cancelled", "cancel_requested": True, "reason": "wrong <dataset>"},
    )


def test_a_cancel_without_a_reason_says_none_was_given_and_a_too_long_one_is_refused(shop: Shop) -> None:
    job = shop.submit(name="doomed")
    client = shop.client("member")
    refused = client.post(f"/jobs/{job.pk}/cancel/", {"reason": "x" * 501}, follow=True)
    assert "The reason is 501 characters long; write at most 500." in refused.content.decode()
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_at) == (JobState.QUEUED, None)
    client.post(f"/jobs/{job.pk}/cancel/")
    html = _html(client, f"/jobs/{job.pk}/")
    assert '<dd id="job-cancelled-by">p-member <span class="hint">(no reason given)</span></dd>' in html


def test_the_cancel_api_takes_an_optional_reason_and_the_job_api_shows_it(shop: Shop) -> None:
    job = shop.submit(name="doomed")
    api = APIClient()
    api.force_authenticate(shop.users["member"])
    unknown = api.post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "done", "why": "x"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["fields"] == {
        "why": ["This operation has no field 'why'; it takes: reason (see /api/docs/)."]
    }
    too_long = api.post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "x" * 501}, format="json")
    assert too_long.status_code == 400
    job.refresh_from_db()
    assert job.cancel_requested_at is None  # refused before anything happened

    reply = api.post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "superseded by run 2"}, format="json")
    assert reply.status_code == 202
    assert (reply.json()["cancelled_by"], reply.json()["cancel_reason"]) == ("p-member", "superseded by run 2")
    detail = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["cancelled_by"], detail["cancel_reason"]) == ("p-member", "superseded by run 2")

    plain = shop.submit(name="plain")
    assert api.post(f"/api/v1/jobs/{plain.pk}/cancel/").status_code == 202  # no body, as before
    assert api.get(f"/api/v1/jobs/{plain.pk}/").json()["cancel_reason"] == ""


def test_cancels_nobody_asked_for_say_the_portal_or_slurm(shop: Shop) -> None:
    by_slurm = _set(shop.submit(name="scancelled"), state=JobState.CANCELLED, ended_at=timezone.now())
    by_portal = _set(
        shop.submit(name="never"),
        state=JobState.CANCELLED,
        state_reason=NEVER_SATISFIED_REASON,
        cancel_reason="Never able to run: its parent failed.",
    )
    client = shop.client("viewer")
    assert '<dd id="job-cancelled-by">Slurm <span class="hint">(no reason given)</span></dd>' in _html(
        client, f"/jobs/{by_slurm.pk}/"
    )
    assert (
        '<dd id="job-cancelled-by">the portal, because: <q id="job-cancel-reason">Never able to run: its parent '
        "failed.</q></dd>"
    ) in _html(client, f"/jobs/{by_portal.pk}/")
    cancelled = job_cancel(user=shop.users["member"], job=shop.submit(name="mine"), reason="oops")
    assert (cancelled.cancelled_by, cancelled.cancel_reason) == ("p-member", "oops")
