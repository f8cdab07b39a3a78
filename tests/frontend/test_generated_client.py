"""A client generated from the served schema works, as an automation user would use it: openapi-python-client
makes a typed client from `/api/schema/`, and a token, the projects, an estimate, a submission followed to its
end, its log and a quota refusal (409) all go through it against the real server, worker and cluster.

It runs against the ASGI server the browser journeys use (`live_portal`), hence its place here.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.models import JobState
from quotas.models import Allocation
from quotas.services import allocation_grant
from tests.factories import PASSWORD
from tests.jobs.conftest import LiveProject, live_project  # noqa: F401  (the fixture, shared with tests/jobs)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

PACKAGE = "gpu_portal_client"
SCRIPT = "#!/bin/bash\necho from the generated client\n"


@pytest.fixture
def generated(live_portal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The client package generated from the schema the portal serves; a function returns its modules."""
    schema = httpx.get(f"{live_portal}/api/schema/", params={"format": "json"}, timeout=30)
    assert schema.status_code == 200
    (tmp_path / "schema.json").write_bytes(schema.content)
    generator = Path(sys.executable).with_name("openapi-python-client")
    made = subprocess.run(
        [str(generator), "generate", "--path", "schema.json", "--output-path", PACKAGE, "--meta", "none"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    return lambda name: importlib.import_module(f"{PACKAGE}.{name}")


def test_a_generated_client_signs_in_submits_follows_reads_the_log_and_parses_a_refusal(
    generated: Any,
    live_portal: str,
    live_project: LiveProject,  # noqa: F811
    celery_worker: str,
) -> None:
    models, tokens_create = generated("models"), generated("api.tokens.tokens_create")
    anonymous = generated("client").Client(base_url=live_portal)

    created = tokens_create.sync(
        client=anonymous,
        body=models.TokenCreateInputRequest(name="pipeline", username=live_project.member.username, password=PASSWORD),
    )
    assert isinstance(created, models.CreatedTokenOutput)
    api = generated("client").AuthenticatedClient(base_url=live_portal, token=created.token)

    projects = generated("api.projects.projects_list").sync(client=api)
    assert [project.slug for project in projects.results] == [live_project.project.slug]

    request = {"project": live_project.label, "cluster": "local", "partition": "h100", "gpu_type": "h100"}
    estimate = generated("api.estimates.estimates_create").sync(
        client=api, body=models.EstimateInputRequest(**request, gpus=2, time_limit_minutes=30)
    )
    assert isinstance(estimate, models.EstimateOutput)
    assert (Decimal(estimate.gpu_hours), estimate.fits) == (Decimal(1), True)

    submitted = generated("api.jobs.jobs_create").sync(
        client=api,
        body=models.JobSubmitInputRequest(**request, gpus=1, time_limit_minutes=2, script=SCRIPT),
    )
    assert isinstance(submitted, models.JobSubmitOutput)
    live_project.wait_for(submitted.id, lambda job: job.is_final)
    detail = generated("api.jobs.jobs_retrieve").sync(submitted.id, client=api)
    assert detail.state.value == JobState.COMPLETED
    log = generated("api.jobs.jobs_log_download").sync(submitted.id, client=api)
    assert log == "from the generated client\n"

    allocation = Allocation.objects.get(project=live_project.project)
    allocation_grant(actor=None, allocation=allocation, gpu_seconds=-(allocation.remaining_gpu_seconds - 3600), note="")
    refused = generated("api.jobs.jobs_create").sync(
        client=api, body=models.JobSubmitInputRequest(**request, gpus=2, time_limit_minutes=60, script=SCRIPT)
    )
    assert isinstance(refused, models.Error)
    assert refused.code == "quota_exceeded"
    assert refused.message.startswith("This job needs 2.0 GPU-hours (2 GPUs x 60 min)")
