"""GPU efficiency in money: a job's idle GPU-hours priced at its rate exactly, the monthly report of a project, a
tenant and every tenant (JSON and CSV), and who may read which: every role, through the API.

The figures are what the collector leaves (tests/jobs/test_gpu_utilisation.py drives it from real readings);
here they are written directly, so the money can be checked to the micro-unit.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from billing.efficiency import (
    ScopeTotals,
    efficiency_report,
    efficiency_sums_add,
    efficiency_sums_mismatches,
    efficiency_sums_rebuild,
    job_waste,
    job_waste_for,
)
from billing.models import EfficiencySum
from billing.rates import RateBook, rate_create
from billing.spend import SpendScope
from clusters.models import Cluster
from jobs.models import Job, JobEfficiency, JobState
from tenants.models import Project, Tenant
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _at(day: int, hour: int) -> datetime:
    return datetime(2025, 3, day, hour, tzinfo=UTC)


def _measured(
    project: Project,
    cluster: Cluster,
    user: User,
    *,
    name: str,
    gpus: int,
    gpu_type: str,
    start: datetime,
    hours: int,
    idle_gpu_seconds: int,
    mean_percent: int,
    ended_for_idling: bool = False,
    time_limit_minutes: int | None = None,
) -> Job:
    end = start + timedelta(hours=hours)
    job = Job.objects.create(
        project=project,
        cluster=cluster,
        user=user,
        cluster_username=user.username[:32],
        name=name,
        partition="gpu",
        gpu_type=gpu_type,
        gpus=gpus,
        time_limit_minutes=time_limit_minutes or hours * 60,
        state=JobState.CANCELLED if ended_for_idling else JobState.COMPLETED,
        started_at=start,
        ended_at=end,
    )
    observed = gpus * hours * 3600
    JobEfficiency.objects.create(
        job=job,
        source="dcgm",
        observed_gpu_seconds=observed,
        utilisation_percent_seconds=float(mean_percent * observed),
        peak_memory_mib=21714,
        idle_gpu_seconds=idle_gpu_seconds,
        ended_at=end if ended_for_idling else None,
    )
    return job


class World:
    """Tenant acme (vision, speech) and tenant other (lab) in March 2025; h100 at 3 EUR, any other type at 2."""

    def __init__(self) -> None:
        cluster = make_matrix_cluster("effcluster")
        for gpu_type, price in (("h100", "3"), ("", "2")):
            rate_create(
                actor=None,
                cluster=cluster,
                gpu_type=gpu_type,
                price_per_gpu_hour=Decimal(price),
                currency="EUR",
                valid_from=datetime(2025, 1, 1, tzinfo=UTC),
            )
        self.tenant_admin = make_user("effadmin")
        self.acme = make_tenant("acme", admin=self.tenant_admin)
        self.vision, self.speech = make_project(self.acme, "vision"), make_project(self.acme, "speech")
        self.other_admin = make_user("otheradmin")
        self.lab = make_project(make_tenant("other", admin=self.other_admin), "lab")
        self.ann = make_user("ann")
        add_project_member(self.vision, self.ann)
        add_project_member(self.speech, self.ann)
        # 2 h100s for 2 h, idle 1.5 GPU-hours at 3 EUR: 4.50.
        self.notebook = _measured(
            self.vision, cluster, self.ann, name="notebook", gpus=2, gpu_type="h100", start=_at(10, 8), hours=2,
            idle_gpu_seconds=5400, mean_percent=30,
        )  # fmt: skip
        # 1 GPU of any type, idle 1,234 s at 2 EUR: 0.685556 to the micro-unit, 0.69 to the cent.
        self.loader = _measured(
            self.vision, cluster, self.ann, name="loader", gpus=1, gpu_type="", start=_at(11, 8), hours=1,
            idle_gpu_seconds=1234, mean_percent=17,
        )  # fmt: skip
        self.busy = _measured(
            self.speech, cluster, self.ann, name="busy", gpus=1, gpu_type="h100", start=_at(12, 8), hours=1,
            idle_gpu_seconds=0, mean_percent=99,
        )  # fmt: skip
        # Ended by the idle policy after 1 h of a 4 h limit: 3 GPU-hours not burnt, 6.00 EUR saved; idle 2.00.
        self.ended = _measured(
            self.speech, cluster, self.ann, name="ended", gpus=1, gpu_type="", start=_at(13, 10), hours=1,
            idle_gpu_seconds=3600, mean_percent=0, ended_for_idling=True, time_limit_minutes=240,
        )  # fmt: skip
        # Another tenant: 2 idle GPU-hours at 3 EUR.
        self.foreign = _measured(
            self.lab, cluster, make_user(), name="foreign", gpus=1, gpu_type="h100", start=_at(14, 8), hours=2,
            idle_gpu_seconds=7200, mean_percent=0,
        )  # fmt: skip
        # February: not in March's report.
        _measured(
            self.vision, cluster, self.ann, name="february", gpus=1, gpu_type="h100",
            start=datetime(2025, 2, 27, 8, tzinfo=UTC), hours=1, idle_gpu_seconds=3600, mean_percent=0,
        )  # fmt: skip


@pytest.fixture
def world() -> World:
    return World()


def _get(user: Any, url: str, **params: Any) -> Any:
    api = APIClient()
    api.force_authenticate(user)
    return api.get(url, params)


def _report(user: Any, **params: Any) -> Any:
    return _get(user, "/api/v1/efficiency/", month="2025-03", **params)


def test_the_idle_cost_is_the_idle_gpu_hours_times_the_rate_exactly(world: World) -> None:
    notebook = job_waste_for(world.notebook)
    loader = job_waste_for(world.loader)
    assert notebook is not None
    assert loader is not None

    assert notebook.idle_cost == Decimal(5400) / 3600 * Decimal(3) == Decimal("4.5")
    assert (notebook.idle_gpu_hours, notebook.idle_amount, notebook.currency) == (
        Decimal("1.50"),
        Decimal("4.50"),
        "EUR",
    )
    # 1,234 GPU-seconds x 2 EUR per GPU-hour = 0.68555...: kept to the micro-unit, rounded to the cent once.
    assert loader.idle_cost == Decimal("0.685556")
    assert loader.idle_amount == Decimal("0.69")
    assert job_waste_for(Job.objects.get(pk=world.busy.pk)).idle_cost == Decimal("0.000000")  # type: ignore[union-attr]


def test_a_tenants_month_idle_hours_cost_saving_and_worst_jobs(world: World) -> None:
    report = _report(world.tenant_admin, tenant="acme").json()

    assert report["scope"] == {"kind": "tenant", "name": "acme"}
    # (5400 + 1234 + 0 + 3600) s = 2.84 GPU-hours; 4.50 + 0.685556 + 0 + 2.00 = 7.185556, rounded once: 7.19.
    assert report["totals"] == {
        "jobs": 4,
        "mean_utilisation_percent": round((30 * 14400 + 17 * 3600 + 99 * 3600) / (14400 + 3600 + 3600 + 3600), 1),
        "idle_gpu_hours": "2.84",
        "idle_cost": [{"currency": "EUR", "amount": "7.19"}],
        "jobs_ended_for_idling": 1,
        "saved_gpu_hours": "3.00",
        "saved": [{"currency": "EUR", "amount": "6.00"}],
    }
    assert [(group["name"], group["idle_cost"]) for group in report["groups"]] == [
        ("acme/speech", [{"currency": "EUR", "amount": "2.00"}]),
        ("acme/vision", [{"currency": "EUR", "amount": "5.19"}]),
    ]
    assert [(job["name"], job["idle_gpu_hours"], job["idle_cost"]) for job in report["worst_jobs"]] == [
        ("notebook", "1.50", "4.50"),
        ("ended", "1.00", "2.00"),
        ("loader", "0.34", "0.69"),
    ]


def test_the_report_as_csv_has_one_line_per_job_worst_first(world: World) -> None:
    manager = make_user()
    add_project_member(world.vision, manager, "manager")

    response = _get(manager, "/api/v1/efficiency/csv/", project="acme/vision", month="2025-03")

    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="efficiency-acme-vision-2025-03.csv"'
    lines = response.content.decode().splitlines()
    assert lines[0] == (
        "job_id,name,project,cluster,user,started_at,ended_at,gpus,utilisation_source,mean_utilisation_percent,"
        "peak_memory_mib,idle_gpu_hours,currency,price_per_gpu_hour,idle_cost,ended_for_idling,saved_gpu_hours,"
        "saved_cost"
    )
    assert lines[1:] == [
        f"{world.notebook.pk},notebook,acme/vision,effcluster,ann,2025-03-10T08:00:00+00:00,2025-03-10T10:00:00+00:00,"
        "2,dcgm,30.0,21714,1.50,EUR,3.0000,4.50,no,0.00,0.00",
        f"{world.loader.pk},loader,acme/vision,effcluster,ann,2025-03-11T08:00:00+00:00,2025-03-11T09:00:00+00:00,"
        "1,dcgm,17.0,21714,0.34,EUR,2.0000,0.69,no,0.00,0.00",
    ]


def _job_names(response: Any) -> set[str]:
    assert response.status_code == 200, response.json()
    return {job["name"] for job in response.json()["worst_jobs"]}


def test_a_tenant_never_sees_another_tenants_figures_whatever_the_role(world: World) -> None:
    roles: dict[str, User] = {}
    for role in ("manager", "member", "viewer"):
        roles[role] = make_user()
        add_project_member(world.vision, roles[role], role)
    outsider = make_user()

    assert _job_names(_report(world.tenant_admin, tenant="acme")) == {"notebook", "ended", "loader"}
    assert _job_names(_report(world.other_admin, tenant="other")) == {"foreign"}
    assert _job_names(_report(roles["manager"], project="acme/vision")) == {"notebook", "loader"}
    assert _job_names(_report(make_user(is_staff=True))) == {"notebook", "ended", "loader", "foreign"}
    assert [group["name"] for group in _report(make_user(is_staff=True)).json()["groups"]] == ["acme", "other"]

    # Another tenant's admin, and anyone outside it, learn nothing, not even that the tenant or project exists.
    for user in (world.other_admin, outsider):
        assert _report(user, tenant="acme").status_code == 404
        assert _report(user, project="acme/vision").status_code == 404
        assert _get(user, f"/api/v1/jobs/{world.notebook.pk}/efficiency/").status_code == 404
    # Inside the tenant, money is for its admins and the project's managers.
    for role in ("member", "viewer"):
        assert _report(roles[role], project="acme/vision").status_code == 403
        assert _report(roles[role], tenant="acme").status_code == 403
    assert _report(roles["manager"], tenant="acme").status_code == 403
    assert _report(roles["manager"], project="acme/speech").status_code == 403
    for user in (world.tenant_admin, roles["manager"], outsider):
        assert _report(user).status_code == 403  # every tenant's: portal admins only


def test_a_jobs_efficiency_and_idle_cost_for_those_who_see_the_job(world: World) -> None:
    figures = _get(world.ann, f"/api/v1/jobs/{world.notebook.pk}/efficiency/").json()

    assert figures == {
        "job": str(world.notebook.pk),
        "name": "notebook",
        "project": "acme/vision",
        "cluster": "effcluster",
        "state": "completed",
        "utilisation_source": "dcgm",
        "mean_utilisation_percent": 30.0,
        "peak_memory_mib": 21714,
        "idle_gpu_hours": "1.50",
        "currency": "EUR",
        "price_per_gpu_hour": "3.0000",
        "idle_cost": "4.50",
        "ended_for_idling": False,
    }


def test_the_database_sums_are_job_waste_summed_job_by_job() -> None:
    """The report's totals and groups come from the database (a month of a busy cluster is too many jobs to load);
    they must be exactly what pricing every job with `job_waste` and adding them up gives: rates that change in
    the month, a GPU type's own rate beside the cluster's, two currencies, a cluster without rates, jobs ended
    for idling, and idle seconds whose costs round differently one job at a time than summed."""
    import random

    priced, foreign, unpriced = (make_matrix_cluster(name) for name in ("sumeur", "sumusd", "sumfree"))
    changes = [
        (priced, "h100", "2.7531", "EUR", datetime(2025, 1, 1, tzinfo=UTC)),
        (priced, "h100", "3.1007", "EUR", datetime(2025, 3, 12, 13, tzinfo=UTC)),
        (priced, "", "1.3333", "EUR", datetime(2025, 1, 1, tzinfo=UTC)),
        (priced, "", "1.7777", "EUR", datetime(2025, 3, 20, tzinfo=UTC)),
        (foreign, "", "0.9999", "USD", datetime(2025, 3, 5, tzinfo=UTC)),  # jobs before it are unpriced
    ]
    for cluster, gpu_type, price, currency, valid_from in changes:
        rate_create(
            actor=None,
            cluster=cluster,
            gpu_type=gpu_type,
            price_per_gpu_hour=Decimal(price),
            currency=currency,
            valid_from=valid_from,
        )
    tenant = make_tenant("sums")
    projects = [make_project(tenant, slug) for slug in ("one", "two", "three")]
    user = make_user("summer")
    chance = random.Random(24)
    for number in range(120):
        _measured(
            chance.choice(projects),
            chance.choice((priced, priced, foreign, unpriced)),
            user,
            name=f"job-{number}",
            gpus=chance.choice((1, 2, 3, 8)),
            gpu_type=chance.choice(("h100", "a100", "")),
            start=_at(chance.randint(1, 30), chance.randint(0, 23)) + timedelta(seconds=chance.randint(0, 3599)),
            hours=chance.randint(1, 5),
            idle_gpu_seconds=chance.randint(0, 20_000),
            mean_percent=chance.randint(0, 100),
            ended_for_idling=chance.random() < 0.3,
            time_limit_minutes=chance.choice((None, 300, 600)),
        )

    def check(phase: str) -> None:
        for scope in (SpendScope(project=projects[0]), SpendScope(tenant=tenant), SpendScope()):
            _check_report(scope, tenant, [priced, foreign, unpriced], phase)

    check("every job summed live")
    # The jobs ended an hour and more before `now` are added to the sums: about half of them.
    middle = datetime(2025, 3, 16, tzinfo=UTC)
    Job.objects.update(updated_at=datetime(2025, 3, 1, tzinfo=UTC))
    JobEfficiency.objects.update(updated_at=datetime(2025, 3, 1, tzinfo=UTC))
    added = efficiency_sums_add(now=middle, batch=7)
    assert 20 < added < 100
    assert JobEfficiency.objects.filter(summed=False).exists()
    check("half from the sums, half live")
    assert efficiency_sums_add(now=middle) == 0  # each job once
    assert efficiency_sums_add(now=datetime(2025, 5, 1, tzinfo=UTC)) == 120 - added
    check("every job from the sums")
    assert efficiency_sums_mismatches() == []
    EfficiencySum.objects.filter(currency="USD").update(idle_cost=F("idle_cost") + Decimal("0.000001"))
    assert efficiency_sums_mismatches()
    # A rebuild makes every sum again, idlest lists included, from the jobs settled then.
    EfficiencySum.objects.update(idlest=[])
    assert efficiency_sums_rebuild(now=middle) == added
    assert efficiency_sums_mismatches() == []
    check("rebuilt: half from the sums, half live")
    assert efficiency_sums_rebuild(now=datetime(2025, 5, 1, tzinfo=UTC)) == 120
    check("rebuilt: every job from the sums")


def _check_report(scope: SpendScope, tenant: Tenant, clusters: list[Cluster], phase: str) -> None:
    report = efficiency_report(scope=scope, month=datetime(2025, 3, 1).date(), with_jobs=True)
    efficiencies = JobEfficiency.objects.filter(job__started_at__month=3, job__project__tenant=tenant)
    if scope.project is not None:
        efficiencies = efficiencies.filter(job__project=scope.project)
    rates = RateBook.for_clusters([cluster.pk for cluster in clusters])
    expected, groups = ScopeTotals(), dict[str, ScopeTotals]()
    for efficiency in efficiencies.select_related("job__project__tenant"):
        waste = job_waste(job=efficiency.job, efficiency=efficiency, rates=rates)
        expected.add(waste)
        key = str(efficiency.job.project) if scope.tenant or scope.project else tenant.slug
        groups.setdefault(key, ScopeTotals()).add(waste)

    def figures(totals: ScopeTotals) -> tuple[object, ...]:
        return (
            totals.jobs,
            totals.observed_gpu_seconds,
            totals.idle_gpu_seconds,
            totals.saved_gpu_seconds,
            totals.ended_for_idling,
            dict(totals.idle_costs),
            dict(totals.saved_costs),
            totals.mean_utilisation_percent,
        )

    assert figures(report.totals) == figures(expected), phase
    assert expected.jobs > 20
    assert set(expected.idle_costs) == {"EUR", "USD"}
    assert expected.saved_gpu_seconds
    assert {key: figures(value) for key, value in report.by_group.items()} == {
        key: figures(value) for key, value in groups.items()
    }
    idlest = sorted(
        (waste for waste in report.jobs if waste.efficiency.idle_gpu_seconds > 0),
        key=lambda waste: (-waste.efficiency.idle_gpu_seconds, str(waste.job.pk)),
    )
    for worst in (1, 5, 10):
        found = efficiency_report(scope=scope, month=datetime(2025, 3, 1).date(), worst=worst).worst
        assert [waste.job.pk for waste in found] == [waste.job.pk for waste in idlest[:worst]], phase
    assert [waste.job.pk for waste in report.jobs] == [
        waste.job.pk
        for waste in sorted(report.jobs, key=lambda waste: (-waste.efficiency.idle_gpu_seconds, str(waste.job.pk)))
    ]


def _planner_believes_summed() -> str:
    """What PostgreSQL's statistics (the last ANALYZE) say the summed column mostly holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT most_common_vals::text FROM pg_stats WHERE tablename = 'jobs_jobefficiency' AND attname = 'summed'"
        )
        row = cursor.fetchone()
    return row[0] if row else ""


def test_marking_many_jobs_summed_leaves_the_planners_statistics_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild, or an add run that marks many jobs summed (catching up after an upgrade), analyzes the table:
    with statistics that still said "not summed" the report read a month's jobs through the wrong index (2.6 s at
    1M jobs, where autovacuum had not passed yet)."""
    from django.db import connection

    from billing import efficiency

    cluster, project, user = make_matrix_cluster("stats"), make_project(make_tenant("stats"), "one"), make_user("st")
    for number in range(6):
        _measured(
            project, cluster, user, name=f"s{number}", gpus=1, gpu_type="h100", start=_at(2, number),
            hours=1, idle_gpu_seconds=60, mean_percent=5,
        )  # fmt: skip
    settled = timezone.now() + timedelta(days=1)  # every job ended and unchanged for more than the hour it waits

    def analyzed_unsummed() -> None:
        JobEfficiency.objects.update(summed=False)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_jobefficiency")
        assert _planner_believes_summed() == "{f}"

    analyzed_unsummed()
    assert efficiency_sums_rebuild(now=settled) == 6
    assert _planner_believes_summed() == "{t}"

    analyzed_unsummed()
    assert efficiency_sums_add(now=settled) == 6  # fewer than STATISTICS_REFRESH_ROWS: autovacuum's business
    assert _planner_believes_summed() == "{f}"

    analyzed_unsummed()
    monkeypatch.setattr(efficiency, "STATISTICS_REFRESH_ROWS", 5)
    EfficiencySum.objects.all().delete()
    assert efficiency_sums_add(now=settled) == 6
    assert _planner_believes_summed() == "{t}"
