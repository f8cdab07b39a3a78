"""The portal's contract with every Slurm generation: the same journey on each live cluster (22.05, 24.11, 26.05).

Registering the cluster, reading its inventory, creating the project's account and associations, submitting
through the API and a real Celery worker, following the job to its end, reading its log, charging what Slurm
accounted, cancelling, and writing the GPU-minute limit and repairing it when changed behind the portal's back.
"""

from __future__ import annotations

import time

import pytest
from django.db import transaction
from django.test import Client

from clusters.accounts import cluster_slurm_reconcile
from clusters.clients import slurm_client_for
from clusters.models import Cluster, GpuType, Node, Partition, SlurmDriftKind
from clusters.slurm.codecs import SUPPORTED_VERSIONS_NEWEST_FIRST
from clusters.slurm.codecs.base import expand_hostlist
from jobs.job_services import JobRequest, job_submit
from jobs.job_sync import _submission, job_deliver
from jobs.models import Job, JobState
from jobs.paths import job_directory_prepare
from jobs.quota_usage import QuotaUsageResult, quota_usage_collect
from jobs.templates import MULTI_NODE_TRAINING
from quotas.models import LedgerEntry
from quotas.slurm_limits import quota_limit_sync
from tests.conftest import SentTask, celery_workers_idle
from tests.jobs.conftest import LiveProject
from tests.live_clusters import LiveCluster

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def _collect_until_charged(project: LiveProject, job: Job) -> QuotaUsageResult:
    """Collect as the periodic sync does, every second, until the job is charged: slurmdbd may take a moment."""
    deadline = time.monotonic() + 60
    while True:
        cluster = Cluster.objects.get(pk=project.cluster.pk)
        result = quota_usage_collect(cluster=cluster, client=slurm_client_for(cluster))
        if LedgerEntry.objects.filter(job=job, kind="charge").exists() or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_the_cluster_is_registered_with_its_version_and_inventory(
    live: LiveCluster, contract_project: LiveProject
) -> None:
    cluster = Cluster.objects.get(pk=contract_project.cluster.pk)

    assert cluster.api_version in SUPPORTED_VERSIONS_NEWEST_FIRST
    assert cluster.slurm_release == live.slurm_release
    assert (cluster.last_ping_ok, cluster.last_ping_error) == (True, "")
    partitions = {partition.name: partition for partition in Partition.objects.filter(cluster=cluster)}
    assert {"debug", live.gpu_partition} <= set(partitions)
    assert partitions[live.gpu_partition].gpu_types == [live.gpu_type]
    assert partitions[live.gpu_partition].max_gpus_per_node == live.gpus_per_node
    gpu_type = GpuType.objects.get(cluster=cluster, name=live.gpu_type)
    assert gpu_type.gpus_total == 2 * live.gpus_per_node


def test_a_job_goes_from_the_api_through_slurm_to_its_log_and_its_charge(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    reply = contract_project.submit(
        name="contract", gpus=2, script="#!/bin/bash\necho hello from $SLURM_CLUSTER_NAME\nsleep 2\n"
    )
    failing = contract_project.submit(name="failing", script="#!/bin/bash\necho failing >&2\nexit 3\n")

    job = contract_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.state == JobState.COMPLETED
    assert job.exit_code == 0
    assert [transition.to_state for transition in job.transitions.order_by("id")][-1] == "completed"
    log = contract_project.api.get(f"/api/v1/jobs/{job.pk}/log/?stream=stdout")
    assert log.status_code == 200
    assert log.content == f"hello from {live.name}\n".encode()

    failed = contract_project.wait_for(failing["id"], lambda job: job.is_final)
    assert (failed.state, failed.exit_code) == (JobState.FAILED, 3)
    detail = contract_project.api.get(f"/api/v1/jobs/{failed.pk}/").json()
    assert detail["exit_code"] == 3

    result = _collect_until_charged(contract_project, job)
    assert result.accounting_error == ""
    record = slurm_client_for(contract_project.cluster).accounting_job(job_id=job.slurm_job_id or 0)
    charge = LedgerEntry.objects.get(job=job, kind="charge")
    assert charge.gpu_seconds == record.elapsed_seconds * 2


def test_a_two_node_job_runs_on_two_nodes_and_its_page_names_them_and_their_switches(
    live: LiveCluster, contract_project: LiveProject, celery_worker: str
) -> None:
    """The multi-node template on two nodes of the GPU partition: srun starts one task per node, each prints its
    rendezvous; the job records both nodes and the leaf switches the sync read from the nodes' features."""
    if not live.switches:
        pytest.skip(f"cluster {live.name} was started before it described its network: run `make cluster`")
    cluster = Cluster.objects.get(pk=contract_project.cluster.pk)
    nodes = {node.name: node.switch for node in Node.objects.filter(cluster=cluster)}
    assert nodes == {node: live.switch_of(node) for node in nodes}
    # One switch where the partition's nodes share one (local's h100 pair, asked as a constraint on 22.05); on the
    # chroot clusters each node has its own, so the job may span both, and says it would wait a minute for fewer.
    one_switch = Partition.objects.get(cluster=cluster, name=live.gpu_partition).nodes_by_switch.get("leaf1") == 2
    shape = {"switches": 1} if one_switch else {"switches": 2, "switch_wait_minutes": 1}
    reply = contract_project.submit(
        name="two nodes",
        template=MULTI_NODE_TRAINING.id,
        script=MULTI_NODE_TRAINING.script,  # the fixture's default script would override the template's
        nodes=2,
        gpus=1,
        time_limit_minutes=2,
        **shape,
    )
    assert (reply["node_count"], reply["gpus"], reply["total_gpus"]) == (2, 1, 2)
    estimate = reply["estimate"]
    assert estimate is None or (isinstance(estimate, dict) and estimate["total_gpus"] == 2)

    job = contract_project.wait_for(reply["id"], lambda job: job.is_final, timeout=90)
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0), job.last_error
    ran_on = expand_hostlist(job.nodes)
    assert len(ran_on) == 2
    assert job.switches == list(dict.fromkeys(live.switch_of(node) for node in ran_on))
    if one_switch:
        assert job.switches == ["leaf1"]
    log = contract_project.api.get(f"/api/v1/jobs/{job.pk}/log/?stream=stdout").content.decode()
    assert f"rendezvous {ran_on[0]}:29500: 2 nodes ({' '.join(ran_on)}) x 1 GPUs = 2 processes" in log
    assert sorted(line.split(":")[0] for line in log.splitlines() if "NODE_RANK=" in line) == [
        f"node {node}" for node in sorted(ran_on)
    ]
    assert "all 2 nodes done" in log

    detail = contract_project.api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["nodes"], detail["switches"], detail["node_count"]) == (job.nodes, job.switches, 2)
    browser = Client()
    browser.force_login(contract_project.member)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert f'<dd id="job-nodes">{job.nodes}</dd>' in page
    switches = ", ".join(job.switches)
    expected = f"all under switch {switches}" if len(job.switches) == 1 else f"spans 2 switches: {switches}"
    assert f'<dd id="job-switches">{expected}</dd>' in page
    assert '<dd id="job-gpus">2 in all: 2 nodes \N{MULTIPLICATION SIGN} 1' in page


def test_a_running_job_is_cancelled_through_the_portal(contract_project: LiveProject, celery_worker: str) -> None:
    reply = contract_project.submit(name="long", script="#!/bin/bash\necho started\nsleep 300\n")
    contract_project.wait_for(reply["id"], lambda job: job.state == JobState.RUNNING)

    manager = contract_project.client_for(contract_project.manager)
    assert manager.post(f"/api/v1/jobs/{reply['id']}/cancel/").status_code == 202

    job = contract_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.state == JobState.CANCELLED
    assert Job.objects.get(pk=job.pk).ended_at is not None


def test_the_gpu_minute_limit_is_written_and_drift_is_repaired(
    live: LiveCluster, contract_project: LiveProject
) -> None:
    cluster, project = contract_project.cluster, contract_project.project
    client = slurm_client_for(cluster)
    # The fixture's services queued limit syncs of their own; a worker of earlier tests would run them at any
    # moment, and repair the change below before the reconcile could find it.
    celery_workers_idle()
    quota_limit_sync(project_id=project.pk, cluster_id=cluster.pk)
    expected = client.account_gpu_minutes_limit(account=project.slurm_account, cluster=cluster.name)
    assert expected is not None
    assert expected > 0

    live.slurm_command("sacctmgr", "-i", "modify", "account", project.slurm_account, "set", "GrpTRESMins=gres/gpu=5")
    report = cluster_slurm_reconcile(cluster_id=cluster.pk)

    assert report.error == ""
    assert [(finding["kind"], finding["repaired"]) for finding in report.findings] == [
        (SlurmDriftKind.GPU_LIMIT.value, True)
    ]
    assert client.account_gpu_minutes_limit(account=project.slurm_account, cluster=cluster.name) == expected
    assert cluster_slurm_reconcile(cluster_id=cluster.pk).findings == []


def test_a_submission_whose_reply_was_lost_is_found_by_its_tag_not_submitted_twice(
    contract_project: LiveProject, sent_tasks: list[SentTask]
) -> None:
    """A worker died after slurmrestd accepted the job, before it recorded the id: the next delivery finds the
    job by the portal's tag in the comment, on every Slurm generation, and submits nothing."""
    with transaction.atomic():
        job, _ = job_submit(
            user=contract_project.member,
            project=contract_project.project,
            request=JobRequest(
                cluster=contract_project.cluster.name,
                partition=contract_project.partition,
                gpu_type=contract_project.gpu_type,
                gpus=1,
                script="#!/bin/bash\nsleep 30\n",
            ),
        )
    assert sent_tasks == [("jobs.tasks.job_submit", (str(job.pk),))]  # recorded, never delivered by a worker
    # The first attempt, as far as it got: Slurm has the job, the portal has no id for it.
    job_directory_prepare(
        log_root=job.cluster.log_root, working_directory=job.working_directory, username=job.cluster_username
    )
    client = slurm_client_for(contract_project.cluster)
    accepted = client.submit_job(user=job.cluster_username, submission=_submission(job))
    Job.objects.filter(pk=job.pk).update(submit_attempts=1, submit_lease_until=None)

    delivery = job_deliver(job_id=job.pk)

    assert delivery.outcome == "found in Slurm"
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id) == (JobState.PENDING, accepted.job_id)
    listing = client.list_jobs()
    assert listing is not None
    assert [each.job_id for each in listing.jobs if each.comment == job.slurm_comment] == [accepted.job_id]
