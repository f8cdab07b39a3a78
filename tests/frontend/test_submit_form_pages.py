"""The submit form's CPU and memory fields, checked against the partition's nodes as last synced, and every
error of a submission shown at once beside its field; and the same CPU and memory rule through the REST API."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from jobs.models import Job
from tests.frontend.test_job_pages import Shop, _field_error, _form, shop  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db

# make_matrix_cluster's partition "gpu": nodes with 8 CPUs and 16384 MB (16 GB) of memory.
TOO_MANY_CPUS = (
    "The nodes of partition &#x27;gpu&#x27; have at most 8 CPUs; ask for 8 or fewer per node, or choose a partition "
    "with larger nodes."
)
TOO_MUCH_MEMORY = (
    "The nodes of partition &#x27;gpu&#x27; have at most 16 GB of memory; ask for 16 GB or less per node, or choose "
    "a partition with larger nodes."
)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpus", "9", TOO_MANY_CPUS),
        ("memory_gb", "17", TOO_MUCH_MEMORY),
        ("cpus", "0", "Ask for at least 1 CPU, or leave the CPUs out for the partition&#x27;s default."),
        ("memory_gb", "lots", "Enter a whole number."),
    ],
)
def test_cpus_and_memory_beyond_the_partitions_nodes_are_refused_naming_the_limit(
    shop: Shop,  # noqa: F811
    field: str,
    value: str,
    message: str,
) -> None:
    html = shop.client("member").post("/jobs/new/", _form(**{field: value})).content.decode()

    assert _field_error(html, field) == message
    assert re.search(rf'name="{field}"[^>]*value="{value}"', html)  # what the user wrote is kept
    assert Job.objects.count() == 0


def test_the_form_names_the_partitions_limits_and_the_estimate_the_cpus_and_memory(shop: Shop) -> None:  # noqa: F811
    client = shop.client("member")

    form = client.get("/jobs/new/?project=acme/vision&cluster=pagecluster").content.decode()
    estimate = client.post("/jobs/new/estimates/", _form(cpus="8", memory_gb="16")).content.decode()
    defaults = client.post("/jobs/new/estimates/", _form()).content.decode()
    refused = client.post("/jobs/new/estimates/", _form(cpus="9")).content.decode()

    assert "The nodes of gpu have up to 8 CPUs. Empty: the partition's default." in form
    assert "The nodes of gpu have up to 16 GB. Empty: the partition's default." in form
    assert (
        '<p class="estimate-resources" id="estimate-resources">On each node: 8 CPUs and 16 GB of memory. The nodes of '
        "gpu have up to 8 CPUs and 16 GB.</p>"
    ) in estimate
    assert "CPUs and memory: the partition's defaults on each node. The nodes of gpu have up to 8 CPUs and 16 GB." in (
        defaults
    )
    assert "No estimate until the form is fixed:" in refused
    assert TOO_MANY_CPUS in refused


def test_cpus_and_memory_within_the_nodes_are_stored_and_kept_for_a_rerun(shop: Shop) -> None:  # noqa: F811
    client = shop.client("member")

    response = client.post("/jobs/new/", _form(cpus="8", memory_gb="16"))

    assert response.status_code == 302
    job = Job.objects.get()
    assert (job.cpus, job.memory_gb) == (8, 16)
    rerun = client.get(f"/jobs/new/?rerun={job.pk}").content.decode()
    assert re.search(r'id="id_cpus" name="cpus"[^>]*value="8"', rerun)
    assert re.search(r'id="id_memory_gb" name="memory_gb"[^>]*value="16"', rerun)


def test_three_bad_fields_give_three_messages_beside_three_fields_at_once(shop: Shop) -> None:  # noqa: F811
    """A bad line of the environment used to hide every other error until it was fixed."""
    environment = "JUST_A_NAME\r\nEPOCHS=3\r\n1BAD=x\r\nSLURM_JOB_NAME=mine\r\n"

    html = (
        shop.client("member").post("/jobs/new/", _form(environment=environment, gpus="9", cpus="99")).content.decode()
    )

    assert _field_error(html, "environment") == (  # one paragraph per line, tags stripped
        "Line 1: write NAME=value."
        "Line 3: &#x27;1BAD&#x27; is not a valid variable name: use letters, digits and &#x27;_&#x27;, not starting "
        "with a digit."
        "Line 4: &#x27;SLURM_JOB_NAME&#x27; is set by Slurm itself; choose another name."
    )
    assert _field_error(html, "gpus").startswith("`gpus` counts the GPUs on each node")
    assert _field_error(html, "cpus") == TOO_MANY_CPUS
    assert len(re.findall(r'aria-invalid="true"', html)) == 3
    assert len(re.findall(r'<div class="field-error" id="error-', html)) == 3
    for field in ("environment", "gpus", "cpus"):  # each field points screen readers at its own message
        assert re.search(rf'name="{field}"[^>]*aria-describedby="[^"]*error-{field}"', html) or re.search(
            rf'aria-describedby="[^"]*error-{field}"[^>]*>', html
        )
    assert Job.objects.count() == 0


# The REST API: the same rule, the fields named -----------------------------------------------------------


def _api_submit(shop: Shop, **fields: object) -> object:  # noqa: F811
    api = APIClient()
    api.force_authenticate(shop.users["member"])
    body = {"project": "acme/vision", "cluster": "pagecluster", "partition": "gpu", "script": "#!/bin/bash\n"}
    return api.post("/api/v1/jobs/", {**body, **fields}, format="json")


def test_the_api_accepts_cpus_and_memory_within_the_nodes(shop: Shop) -> None:  # noqa: F811
    response = _api_submit(shop, cpus=8, memory_gb=16)

    assert response.status_code == 202, response.json()  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert (body["cpus"], body["memory_gb"]) == (8, 16)
    assert Job.objects.values_list("cpus", "memory_gb").get() == (8, 16)


def test_the_api_refuses_cpus_and_memory_beyond_the_nodes_by_name_with_every_problem(shop: Shop) -> None:  # noqa: F811
    response = _api_submit(shop, cpus=9, memory_gb=17, environment={"1BAD": "x"})

    assert response.status_code == 400  # type: ignore[attr-defined]
    fields = response.json()["fields"]  # type: ignore[attr-defined]
    assert fields == {
        "cpus": [TOO_MANY_CPUS.replace("&#x27;", "'")],
        "memory_gb": [TOO_MUCH_MEMORY.replace("&#x27;", "'")],
        "environment": ["'1BAD' is not a valid variable name: use letters, digits and '_', not starting with a digit."],
    }
    assert Job.objects.count() == 0


def test_the_estimate_api_checks_cpus_and_memory_as_a_submission_does(shop: Shop) -> None:  # noqa: F811
    api = APIClient()
    api.force_authenticate(shop.users["member"])
    body = {"project": "acme/vision", "cluster": "pagecluster", "partition": "gpu"}

    fits = api.post("/api/v1/estimates/", {**body, "cpus": 8, "memory_gb": 16}, format="json")
    refused = api.post("/api/v1/estimates/", {**body, "cpus": 9, "memory_gb": 17}, format="json")

    assert fits.status_code == 200, fits.json()
    assert refused.status_code == 400
    assert refused.json()["fields"] == {
        "cpus": [TOO_MANY_CPUS.replace("&#x27;", "'")],
        "memory_gb": [TOO_MUCH_MEMORY.replace("&#x27;", "'")],
    }


def test_the_estimate_lists_every_problem_of_the_form_at_once(shop: Shop) -> None:  # noqa: F811
    html = (
        shop.client("member")
        .post("/jobs/new/estimates/", _form(environment="JUST_A_NAME", gpus="9", memory_gb="17"))
        .content.decode()
    )

    problems = re.findall(r"<li>(.*?)</li>", html, re.S)
    assert problems[0] == "Line 1: write NAME=value."
    assert problems[1].startswith("`gpus` counts the GPUs on each node")
    assert problems[2] == TOO_MUCH_MEMORY
    assert len(problems) == 3
