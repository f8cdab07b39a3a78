"""In a real browser on the real server: a portal admin opens the spend overview of every tenant, reads the chart
(its amounts start at zero, the currency on the axis), switches the grouping and downloads the CSV, which holds
the table's figures; a tenant admin's own overview at phone width, nothing overflowing. Screenshots of each."""

from __future__ import annotations

import csv
from typing import Any

import pytest

from tests.billing.spend_overview_worlds import ArithmeticWorld

pytestmark = [pytest.mark.django_db(transaction=True)]

PERIOD = "from=2025-03-11&to=2025-03-20"
CHART = "document.getElementById('spend-overview-chart')"


def _table(page: Any) -> list[list[str]]:
    return [
        [cell.strip() for cell in row]
        for row in page.eval_on_selector_all(
            "#spend-table tbody tr, #spend-table tfoot tr",
            "rows => rows.map(row => Array.from(row.cells, cell => cell.innerText))",
        )
    ]


def _chart_drawn(page: Any) -> None:
    page.wait_for_function(f"{CHART} && {CHART}.spendPlot && {CHART}.spendPlot.scales.y.max > 0")


def test_a_portal_admin_reads_switches_and_downloads_the_spend_overview(open_page: Any, screenshot: Any) -> None:
    world = ArithmeticWorld()

    page = open_page(world.staff)
    page.goto(f"/staff/spend/?{PERIOD}")
    _chart_drawn(page)
    assert page.evaluate(f"{CHART}.spendPlot.scales.y.min") == 0
    assert page.evaluate(f"{CHART}.spendPlot.axes[1].label") == "EUR"
    assert page.evaluate(f"{CHART}.spendPlot.data[0].length") == 2  # acme and globex
    assert _table(page)[-1] == ["Total", "4.00", "8.00", "6.00", "2.00", "+33.3%"]
    screenshot(page, "by-tenant")

    page.get_by_label("Group by").select_option("gpu_type")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/staff/spend/?*group=gpu_type*")
    _chart_drawn(page)
    # The smallest bar is 2.00 EUR; the axis still starts at zero.
    assert page.evaluate(f"{CHART}.spendPlot.scales.y.min") == 0
    table = _table(page)
    assert table == [
        ["h100", "3.00", "6.00", "6.00", "0.00", "+0.0%"],
        ["a100", "1.00", "2.00", "0.00", "2.00", "new"],
        ["Total", "4.00", "8.00", "6.00", "2.00", "+33.3%"],
    ]
    screenshot(page, "by-gpu-type")

    page.get_by_role("link", name="Change %").click()
    page.wait_for_url("**sort=-percent*")
    assert [row[0] for row in _table(page)] == ["a100", "h100", "Total"]

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()
    download = download_info.value
    assert download.suggested_filename == "spend-all-tenants-gpu_type-2025-03-11-2025-03-20.csv"
    with open(download.path(), encoding="utf-8") as csv_file:
        rows = list(csv.reader(csv_file))
    assert [row[:6] for row in rows[2:]] == _table(page)

    page = open_page(world.acme_admin, viewport="phone")
    page.goto(f"/billing/spend/?{PERIOD}")
    _chart_drawn(page)
    assert page.evaluate(f"{CHART}.spendPlot.scales.y.min") == 0
    assert [row[0] for row in _table(page)] == ["acme/vision", "acme/speech", "Total"]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(page, "tenant-phone")
