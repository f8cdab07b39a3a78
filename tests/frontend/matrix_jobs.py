"""Isolation matrix entries for the browser pages of the jobs area (see tests/frontend/page_matrix.py)."""

from __future__ import annotations

from typing import Any

from tests.isolation_rules import PROJECT_MANAGERS, PROJECT_VIEWERS, SUBMITTERS, Case, page_everyone, page_only


def _submission(world: Any) -> dict[str, Any]:
    return {
        "project": "matrixco/matrixproj",
        "cluster": "matrixcluster",
        "partition": "gpu",
        "gpus": "1",
        "time_limit_minutes": "10",
        "name": "from the form",
        "script": "#!/bin/bash\necho page\n",
    }


PAGES: dict[str, dict[str, Case]] = {
    "jobs/": {"GET": Case(page_everyone(200), leak_free_for=("outsider", "tenant_member"))},
    # The form lists only projects one may submit to: viewers and tenant members see none of the tenant's.
    "jobs/new/": {
        "GET": Case(page_everyone(200), leak_free_for=("outsider", "tenant_member", "viewer")),
        "POST": Case(page_only(302, SUBMITTERS), body=_submission, form=True),
    },
    # Estimates (read-only: no audit event) are for everyone who sees the project, as POST /api/v1/estimates/.
    "jobs/new/estimates/": {
        "POST": Case(
            page_only(200, PROJECT_VIEWERS),
            body=lambda world: {"project": "matrixco/matrixproj", "cluster": "matrixcluster"},
            form=True,
        )
    },
    "jobs/<uuid:job_id>/": {"GET": Case(page_only(200, PROJECT_VIEWERS))},
    # The job's owner is the member; managers and tenant admins cancel anyone's job.
    "jobs/<uuid:job_id>/cancel/": {"POST": Case(page_only(302, ("member", *PROJECT_MANAGERS)), form=True)},
    # The job's output as a download (the world's job has written its stdout): whoever sees the job.
    "jobs/<uuid:job_id>/output/<str:stream>/": {"GET": Case(page_only(200, PROJECT_VIEWERS))},
    "jobs/<uuid:job_id>/rerun/": {"POST": Case(page_only(302, SUBMITTERS), form=True)},
    "jobs/<uuid:job_id>/watch/": {
        "POST": Case(page_only(302, PROJECT_VIEWERS), body=lambda world: {"watch": "1"}, form=True)
    },
}
