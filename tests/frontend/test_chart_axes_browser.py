"""Charts have honest axes: an amount's y-axis starts at zero and its label names the unit, read from the uPlot
instance itself in a real browser (the burn-down's remaining GPU-hours sit far above zero, where uPlot's own
range would start)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.test_project_browser import burning, no_broker  # noqa: F401  (the fixtures)

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_burn_down_y_axis_starts_at_zero_and_names_its_unit(
    open_page: Any,
    screenshot: Any,
    burning: dict[str, Any],  # noqa: F811
) -> None:
    page = open_page(burning["user"])
    page.goto(f"/projects/acme/vision/allocations/{burning['allocation'].pk}/")
    page.locator(".burn-down canvas").first.wait_for()

    axis = page.evaluate(
        "(() => { const plot = document.querySelector('.burn-down').portalChart;"
        " return {min: plot.scales.y.min, max: plot.scales.y.max, label: plot.axes[1].label,"
        " highest: Math.max(...plot.data[1].filter(v => v != null)),"
        " lowest: Math.min(...plot.data[1].filter(v => v != null))}; })()"
    )

    # 100 GPU-hours granted, 45 burned: the line runs from 100 down to 55, drawn from 0 up.
    assert (axis["highest"], axis["lowest"]) == (100, 55)
    assert axis["min"] == 0
    assert axis["max"] >= 100
    assert axis["label"] == "Remaining (GPU-hours)"
    screenshot(page, "burn-down-axis")
