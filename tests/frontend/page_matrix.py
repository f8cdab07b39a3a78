"""The browser pages' entries in the isolation matrix, gathered from one file per area of the portal.

Each `matrix_<area>.py` defines PAGES: {route pattern: {method: Case}}, with the rules of
tests/isolation_rules.py (`page_only`, `page_everyone`; `Case(form=True)` posts a browser form).
"""

from __future__ import annotations

from tests.frontend import matrix_billing, matrix_dashboard, matrix_jobs, matrix_projects, matrix_staff
from tests.isolation_rules import Case

PAGES: dict[str, dict[str, Case]] = {}
for area in (matrix_dashboard, matrix_jobs, matrix_projects, matrix_billing, matrix_staff):
    overlap = PAGES.keys() & area.PAGES.keys()
    assert not overlap, f"{area.__name__} repeats {overlap}"
    PAGES.update(area.PAGES)
