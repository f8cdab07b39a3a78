"""The spend overview pages through the test client: /staff/spend/ (portal admins, every tenant) and /billing/spend/
(a tenant's or project's own): the table's figures and order, its totals row, the CSV equal to the table, who may
open each page, and a clear message (400, never a 500) for a bad period, grouping or sort."""

from __future__ import annotations

import csv
import html
import io
import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.spend_overview import previous_period
from tests.billing.spend_overview_worlds import ArithmeticWorld

pytestmark = pytest.mark.django_db

PERIOD = "from=2025-03-11&to=2025-03-20"


@pytest.fixture
def world() -> ArithmeticWorld:
    return ArithmeticWorld()


def _get(user: Any, url: str) -> Any:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client.get(url)


def _text(response: Any) -> str:
    return html.unescape(str(response.content.decode()))


def _table(page: str) -> list[list[str]]:
    """The overview table's rows (body, then the totals row) as the cells' text."""
    table = re.search(r'<table class="spend-overview-table".*?</table>', page, re.S)
    assert table, "no overview table"
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(0).split("</thead>")[1], re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        for row in rows
    ]


def test_a_portal_admin_sees_every_tenants_spend_per_project_with_its_change(world: ArithmeticWorld) -> None:
    response = _get(world.staff, f"/staff/spend/?{PERIOD}&group=project")

    assert response.status_code == 200
    assert _table(response.content.decode()) == [
        ["acme/vision", "3.00", "6.00", "2.00", "4.00", "+200.0%"],
        ["acme/speech", "1.00", "2.00", "0.00", "2.00", "new"],
        ["globex/lab", "0.00", "0.00", "4.00", "-4.00", "-100.0%"],
        ["Total", "4.00", "8.00", "6.00", "2.00", "+33.3%"],
    ]


@pytest.mark.parametrize(
    ("sort", "names"),
    [
        ("name", ["acme/speech", "acme/vision", "globex/lab"]),
        ("-name", ["globex/lab", "acme/vision", "acme/speech"]),
        ("change", ["globex/lab", "acme/speech", "acme/vision"]),
        ("-previous", ["globex/lab", "acme/vision", "acme/speech"]),
        ("-percent", ["acme/speech", "acme/vision", "globex/lab"]),
    ],
)
def test_the_table_sorts_by_the_column_in_the_url(world: ArithmeticWorld, sort: str, names: list[str]) -> None:
    response = _get(world.staff, f"/staff/spend/?{PERIOD}&group=project&sort={sort}")

    rows = _table(response.content.decode())
    assert [row[0] for row in rows] == [*names, "Total"]


def test_the_csv_holds_the_tables_figures_in_its_order(world: ArithmeticWorld) -> None:
    query = f"{PERIOD}&group=cluster&sort=name"
    table = _table(_get(world.staff, f"/staff/spend/?{query}").content.decode())

    response = _get(world.staff, f"/staff/spend/?{query}&format=csv")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert (
        response["Content-Disposition"] == 'attachment; filename="spend-all-tenants-cluster-2025-03-11-2025-03-20.csv"'
    )
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[1] == ["# cluster", "gpu_hours", "amount", "previous_amount", "change", "change_percent", "currency"]
    assert [row[:6] for row in rows[2:]] == table
    assert {row[6] for row in rows[2:]} == {"EUR"}
    assert table == [
        ["north", "3.00", "6.00", "6.00", "0.00", "+0.0%"],
        ["south", "1.00", "2.00", "0.00", "2.00", "new"],
        ["Total", "4.00", "8.00", "6.00", "2.00", "+33.3%"],
    ]


@pytest.mark.parametrize("role", ["acme_admin", "manager", "member"])
def test_only_portal_admins_reach_the_overview_of_every_tenant(world: ArithmeticWorld, role: str) -> None:
    response = _get(getattr(world, role), f"/staff/spend/?{PERIOD}")
    csv_response = _get(getattr(world, role), f"/staff/spend/?{PERIOD}&format=csv")

    assert (response.status_code, csv_response.status_code) == (403, 403)
    assert b"globex" not in response.content + csv_response.content


def test_anonymous_visitors_are_sent_to_sign_in(world: ArithmeticWorld) -> None:
    response = _get(None, "/staff/spend/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_tenant_admin_sees_their_tenants_spend_only(world: ArithmeticWorld) -> None:
    response = _get(world.globex_admin, f"/billing/spend/?{PERIOD}")

    assert response.status_code == 200
    page = response.content.decode()
    assert _table(page) == [
        ["globex/lab", "0.00", "0.00", "4.00", "-4.00", "-100.0%"],
        ["Total", "0.00", "0.00", "4.00", "-4.00", "-100.0%"],
    ]
    assert "acme" not in page
    # Naming another tenant finds nothing; its CSV neither.
    assert _get(world.globex_admin, f"/billing/spend/?scope=acme&{PERIOD}").status_code == 404
    assert _get(world.globex_admin, f"/billing/spend/?scope=acme&{PERIOD}&format=csv").status_code == 404
    assert _get(world.globex_admin, f"/billing/spend/?scope=acme/vision&{PERIOD}").status_code == 404


def test_a_tenant_admin_groups_by_gpu_type_and_may_not_group_by_tenant(world: ArithmeticWorld) -> None:
    response = _get(world.acme_admin, f"/billing/spend/?{PERIOD}&group=gpu_type")
    refused = _get(world.acme_admin, f"/billing/spend/?{PERIOD}&group=tenant")

    assert _table(response.content.decode()) == [
        ["h100", "3.00", "6.00", "2.00", "4.00", "+200.0%"],
        ["a100", "1.00", "2.00", "0.00", "2.00", "new"],
        ["Total", "4.00", "8.00", "2.00", "6.00", "+300.0%"],
    ]
    assert refused.status_code == 400
    assert "'tenant' is not a grouping here; pick one of project, cluster, gpu_type." in _text(refused)


def test_a_project_manager_sees_their_project_and_a_member_is_refused(world: ArithmeticWorld) -> None:
    manager = _get(world.manager, f"/billing/spend/?{PERIOD}&group=cluster")
    member = _get(world.member, f"/billing/spend/?{PERIOD}")
    member_naming = _get(world.member, f"/billing/spend/?scope=acme/vision&{PERIOD}")

    assert _table(manager.content.decode()) == [
        ["north", "3.00", "6.00", "2.00", "4.00", "+200.0%"],
        ["Total", "3.00", "6.00", "2.00", "4.00", "+200.0%"],
    ]
    assert (member.status_code, member_naming.status_code) == (403, 403)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "from=2025-03-20&to=2025-03-11",
            "The period ends (2025-03-11) before it starts (2025-03-20); swap the dates.",
        ),
        ("month=2025-13", "'2025-13' is not a month; pick one as YYYY-MM"),
        ("month=march", "'march' is not a month; pick one as YYYY-MM"),
        ("month=2999-01", "January 2999 has not begun yet"),
        ("from=2025-02-30", "'2025-02-30' is not a date for from; give it as YYYY-MM-DD"),
        ("from=2024-01-01&to=2025-03-01", "The period has 426 days; ask for at most 366 at a time"),
        ("group=galaxy", "'galaxy' is not a grouping here; pick one of tenant, project, cluster, gpu_type."),
        ("sort=price", "'price' is not a column to sort by"),
    ],
)
def test_a_bad_query_says_what_to_change(world: ArithmeticWorld, query: str, message: str) -> None:
    response = _get(world.staff, f"/staff/spend/?{query}")
    csv_response = _get(world.staff, f"/staff/spend/?{query}&format=csv")

    assert response.status_code == 400
    assert message in _text(response)
    assert 'id="spend-table"' not in response.content.decode()
    assert csv_response.status_code == 400  # no CSV of a period that was not understood


def test_the_default_is_this_month_against_the_same_days_of_the_last(world: ArithmeticWorld) -> None:
    response = _get(world.staff, "/staff/spend/")

    assert response.status_code == 200
    page = response.content.decode()
    today = timezone.now().date()
    previous_start, previous_end = previous_period(today.replace(day=1), today)
    assert (
        f"{today.replace(day=1)} to {today} (no usage), compared with {previous_start} to {previous_end}"
        in " ".join(page.split())
    )
    assert "No priced usage in this period or the one before." in page
    assert "jobs still running are not in these figures" in page
    assert 'aria-current="page">Spend</a>' in page
