"""Drill: a node set down (`scontrol update state=down`) while it runs portal jobs.

What Slurm 22.05 does (measured on the local cluster, JobRequeue left at its default of 1): every batch job
running on the node is requeued at once. Its run so far is written to accounting as a NODE_FAIL record (elapsed
= the seconds it ran), and the same job id goes back to PENDING with reason BeginTime and restart_cnt 1; it may
start again two minutes later (the credential lifetime), gets a second accounting record for that attempt,
and its output file is opened again from the start. A job that may not be requeued (`--no-requeue`) ends
NODE_FAIL instead; the portal submits none of those, so here every job on the node is requeued. The node
itself comes back by itself as soon as its slurmd registers again (ReturnToService=2); the drill resumes it
explicitly if not, and always at the end.

The portal must show each such job as requeued (a transition "Requeued by Slurm after node X failed; attempt
2", the job pending again, not failed), let it finish, and charge it only what ran: the GPU-seconds of both
runs from accounting, not its time limit.
Usage: python scripts/drills/drill_node_down.py
"""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from typing import Any

import harness  # first: sets up Django on the drill's database
import httpx
from burst import Burst
from ledger import ledger_check

from jobs.models import Job, JobState
from quotas.models import LedgerEntry, LedgerKind

JOBS = 8
RUN_SECONDS = 60
SCRIPT = f'#!/bin/bash\nfor i in $(seq {RUN_SECONDS}); do echo "line $i"; sleep 1; done\n'
TIME_LIMIT_MINUTES = 5
RUN_BEFORE_FAULT_SECONDS = 10
# A requeued job waits ~2 minutes before its second run of RUN_SECONDS, then accounting catches up.
SETTLE_SECONDS = 420


def scontrol(*arguments: str) -> str:
    """Run scontrol; its output (an error is part of it, not an exception: the drill reports what Slurm said)."""
    done = subprocess.run(  # noqa: S603 -- fixed arguments
        ["scontrol", *arguments],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=30,
    )
    return (done.stdout + done.stderr).strip()


def node_state(node: str) -> str:
    """`State=...` of `scontrol show node`, e.g. IDLE, MIXED, DOWN+NOT_RESPONDING."""
    for word in scontrol("show", "node", node).split():
        if word.startswith("State="):
            return word.removeprefix("State=")
    return "unknown"


def node_resume(node: str) -> str:
    """Resume the node if Slurm still holds it down or drained; what was done."""
    state = node_state(node)
    if "DOWN" not in state and "DRAIN" not in state:
        return f"{node} is {state}: nothing to resume"
    answer = scontrol("update", f"nodename={node}", "state=resume")
    return f"{node} was {state}; resumed ({answer or 'ok'}), now {node_state(node)}"


def slurm_view(slurm_job_id: int) -> str:
    """The job's state, reason and restart count, as `scontrol show job` prints them."""
    wanted = ("JobState=", "Reason=", "Restarts=", "NodeList=")
    words = scontrol("show", "job", str(slurm_job_id)).split()
    return " ".join(word for word in words if word.startswith(wanted)) or "not known to slurmctld"


def running_by_node(drill: harness.Drill) -> dict[str, list[Job]]:
    jobs: dict[str, list[Job]] = defaultdict(list)
    for job in Job.objects.filter(project=drill.world.project, state=JobState.RUNNING):
        jobs[job.nodes].append(job)
    return jobs


def portal_view(api: httpx.Client, job: Job) -> dict[str, Any]:
    """The job as its owner sees it through the REST API."""
    body: dict[str, Any] = api.get(f"/api/v1/jobs/{job.pk}/").json()
    return body


def requeue_shown(view: dict[str, Any]) -> bool:
    return any(step["detail"].startswith("Requeued by Slurm") for step in view["transitions"])


def timeline_text(view: dict[str, Any]) -> str:
    return " | ".join(
        f"{step['from_state'] or '-'}->{step['to_state']} {step['detail']!r}" for step in view["transitions"]
    )


def charged_only_what_ran(drill: harness.Drill, victims: list[Job]) -> bool:
    """Each job the node failure hit is charged the GPU-seconds of its runs in accounting, below its reservation."""
    passed = True
    for job in victims:
        job.refresh_from_db()
        records = [
            record
            for record in drill.slurm.accounting_job_records(job_id=job.slurm_job_id or 0)
            if record.comment == job.slurm_comment and record.state.is_finished
        ]
        ran = sum(record.gpu_seconds for record in records)
        charges = list(
            LedgerEntry.objects.filter(job=job, kind=LedgerKind.CHARGE).values_list("gpu_seconds", flat=True)
        )
        reserved = job.gpus * job.time_limit_minutes * 60
        runs = " + ".join(
            f"{record.state.value} {record.elapsed_seconds} s x {record.gpus_allocated}" for record in records
        )
        verdict = "ok" if charges == [ran] and ran < reserved and len(records) >= 2 else "WRONG"
        passed = passed and verdict == "ok"
        drill.say(
            f"  job {str(job.pk)[:8]} (Slurm {job.slurm_job_id}, {job.state}): accounting runs {runs} = {ran} GPU-s; "
            f"charged {charges} GPU-s; reserved {reserved} GPU-s (time limit): {verdict}"
        )
    return passed


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(drill, count=JOBS, per_second=20, script=SCRIPT, time_limit_minutes=TIME_LIMIT_MINUTES)
    burst.wait()
    harness.wait_for(lambda: sum(map(len, running_by_node(drill).values())) == JOBS, timeout_seconds=60)
    time.sleep(RUN_BEFORE_FAULT_SECONDS)
    by_node = running_by_node(drill)
    drill.say("running: " + ", ".join(f"{node}: {len(jobs)} jobs" for node, jobs in sorted(by_node.items())))
    node, victims = max(by_node.items(), key=lambda item: len(item[1]))
    bystanders = [job for jobs in by_node.values() for job in jobs if job.nodes != node]
    try:
        answer = scontrol("update", f"nodename={node}", "state=down", "reason=drill")
        drill.say(
            f"scontrol update nodename={node} state=down reason=drill -> {answer or 'ok'}; {len(victims)} jobs on it"
        )
        time.sleep(2)
        drill.say(f"Slurm: {node} is {node_state(node)}")
        for job in victims:
            drill.say(f"  Slurm job {job.slurm_job_id}: {slurm_view(job.slurm_job_id or 0)}")
        passed = observe_portal(drill, victims)
        drill.say(f"after the observation: {node_resume(node)}")
    finally:
        drill.say(f"restore: {node_resume(node)}")
    passed = ledger_check(drill, burst.submissions, settle_seconds=SETTLE_SECONDS) and passed
    with httpx.Client(base_url=drill.portal.base_url, headers={"Authorization": f"Bearer {drill.world.token}"}) as api:
        for job in victims:
            drill.say(f"  job {str(job.pk)[:8]} in the portal: {timeline_text(portal_view(api, job))}")
    drill.say(f"charges of the {len(victims)} jobs the node failure hit:")
    passed = charged_only_what_ran(drill, victims) and passed
    disturbed = Job.objects.filter(pk__in=[job.pk for job in bystanders], transitions__detail__startswith="Requeued")
    drill.say(f"{len(bystanders)} jobs ran on other nodes; {disturbed.count()} of them were requeued (expected 0)")
    return passed and not disturbed.exists()


def observe_portal(drill: harness.Drill, victims: list[Job]) -> bool:
    """Wait until the portal shows every job of the node as requeued (or ended NODE_FAIL); whether it did."""
    headers = {"Authorization": f"Bearer {drill.world.token}"}
    with httpx.Client(base_url=drill.portal.base_url, headers=headers, timeout=30) as api:

        def all_shown() -> bool:
            views = [portal_view(api, job) for job in victims]
            return all(requeue_shown(view) or view["state"] == JobState.NODE_FAIL for view in views)

        shown = harness.wait_for(all_shown, timeout_seconds=60, poll_seconds=1)
        for job in victims:
            view = portal_view(api, job)
            drill.say(
                f"  portal job {str(job.pk)[:8]}: {view['state']} ({view['pending_reason'] or view['state_reason']}); "
                f"{timeline_text(view)}"
            )
    drill.say(f"portal shows all {len(victims)} as requeued or node failure: {shown}")
    return shown


if __name__ == "__main__":
    harness.main("node-down", "a node set down while it runs jobs: requeued or node failure, charged what ran", run)
