"""Slurm's pending reasons in words a researcher understands."""

from __future__ import annotations

PENDING_REASONS = {
    "Priority": "waiting behind jobs with a higher priority",
    "Resources": "waiting for GPUs or other resources to become free",
    "AssocGrpGRESMinutes": "the project's GPU-hour quota on this cluster is used up",
    "AssocGrpGRESRunMinutes": "the project's running jobs hold all the GPU-minutes its quota allows at once",
    "AssocGrpGRES": "the project already uses as many GPUs at once as its limit allows",
    "AssocGrpCPUMinutes": "the project's CPU-hour quota on this cluster is used up",
    "AssocGrpBillingMinutes": "the project's billing quota on this cluster is used up",
    "AssocGrpJobsLimit": "the project already runs as many jobs at once as its limit allows",
    "AssocMaxJobsLimit": "you already run as many jobs at once as the project allows",
    "AssocGrpSubmitJobsLimit": "the project has as many jobs waiting as its limit allows",
    "QOSMaxGRESPerUser": "you already use as many GPUs at once as your quality of service allows",
    "QOSGrpGRES": "the quality of service already uses all the GPUs it may",
    "ReqNodeNotAvail": "a node the job needs is unavailable (down, drained or reserved)",
    "NodeDown": "a node the job needs is down",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is not accepting jobs to run",
    "PartitionTimeLimit": "the time limit is longer than the partition allows",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows",
    "JobHeldUser": "held by its owner; release it to let it run",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "waiting for its start time",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "the jobs it depends on can never satisfy the dependency; cancel it",
    "Reservation": "waiting for its reservation to start",
    "launch failed requeued held": "launching failed; Slurm requeued and held it",
    "BadConstraints": "its constraints cannot be met by any node",
    "InvalidAccount": "the project's Slurm account is missing or invalid on this cluster",
    "InvalidQOS": "its quality of service is invalid",
    "Cleaning": "waiting for the nodes of an earlier run to be cleaned up",
}


def pending_reason_text(reason: str) -> str:
    """Plain words for Slurm's reason code; unknown codes are shown as Slurm gave them."""
    if not reason or reason == "None":
        return ""
    return PENDING_REASONS.get(reason, f"Slurm says: {reason}")
