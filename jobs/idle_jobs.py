"""What happens to a job whose GPUs idle: its owner (and, by the project's choice, its managers) told once; and, where
the project opted in, a warning to the owner and then the job ended, with the reason in its timeline."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import transaction

from clusters.models import Cluster
from jobs.job_services import jobs_push
from jobs.models import Job, JobEfficiency, JobState, JobTransition, ProjectEfficiencyPolicy
from portal.queue import task_enqueue_on_commit
from tenants.models import ProjectRole
from tenants.notifications import notifications_send

logger = logging.getLogger(__name__)


def idle_jobs_act(*, cluster: Cluster, flagged: list[uuid.UUID], now: datetime) -> None:
    """Tell the owners of the jobs flagged just now; warn, then end, the idle jobs of projects that opted in."""
    for job_id in flagged:
        job_idle_notify(job_id=job_id, now=now)
    idle_jobs_end_opted_in(cluster=cluster, now=now)


def _changed(job_id: uuid.UUID, *, now: datetime) -> None:
    """Mark the job changed, so that its open page (which reloads its facts when `updated_at` moves, on the push
    after commit) shows the flag, the warning or the end without a reload."""
    Job.objects.filter(pk=job_id).update(updated_at=now)


def _tell_owner(job: Job, *, kind: str, title: str, body: str) -> None:
    """A notification (and e-mail) to the job's user about their job, linking to its page."""
    owners = [job.user] if job.user is not None and job.user.is_active else []
    notifications_send(
        users=owners, tenant=job.project.tenant, kind=kind, title=title, body=body, link=f"/jobs/{job.pk}/"
    )


def _minutes(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes} min" if minutes else f"{int(seconds)} s"


def _idle_words(job: Job, efficiency: JobEfficiency, *, now: datetime) -> str:
    assert efficiency.idle_since is not None
    idle_for = _minutes((now - efficiency.idle_since).total_seconds())
    return (
        f"{efficiency.idle_gpus} of its {job.total_gpus} GPU(s) on {job.cluster.name} have been under "
        f"{job.cluster.idle_gpu_threshold_percent}% utilisation for {idle_for}"
    )


def job_idle_notify(*, job_id: uuid.UUID, now: datetime) -> bool:
    """Tell the job's user (and the project's managers where the project asks for it) that its GPUs idle: once
    per job, whatever the number of cycles or workers that flag it. True when this call told them."""
    with transaction.atomic():
        efficiency = (
            JobEfficiency.objects.select_for_update(of=("self",))
            .select_related("job__project__tenant", "job__cluster", "job__user")
            .filter(job_id=job_id, notified_at__isnull=True, flagged_at__isnull=False)
            .first()
        )
        if efficiency is None:
            return False
        job = efficiency.job
        recipients: list[User] = [job.user] if job.user is not None and job.user.is_active else []
        policy = ProjectEfficiencyPolicy.objects.filter(project_id=job.project_id).first()
        if policy is not None and policy.notify_managers:
            recipients += list(
                User.objects.filter(
                    is_active=True,
                    project_memberships__project_id=job.project_id,
                    project_memberships__role=ProjectRole.MANAGER,
                )
            )
        efficiency.notified_at = now
        efficiency.save(update_fields=["notified_at"])
        _changed(job.pk, now=now)
        notifications_send(
            users=recipients,
            tenant=job.project.tenant,
            kind="job.gpu_idle",
            title=f"Job {job.name}: its GPUs are idle",
            body=(
                f"Job {job.name} of {job.project} is running, but {_idle_words(job, efficiency, now=now)}. Idle GPUs "
                "are charged like busy ones and others queue behind them: if the job is waiting on something or "
                "has finished its work, cancel it."
            ),
            link=f"/jobs/{job.pk}/",
        )
    transaction.on_commit(lambda: jobs_push([job_id]))
    return True


def idle_jobs_end_opted_in(*, cluster: Cluster, now: datetime) -> list[uuid.UUID]:
    """For projects that opted in: warn the owner of a job whose GPUs have all been idle for its limit less the
    warning time, and end a warned job idle for the whole limit. Only a job every GPU of which reads idle now
    qualifies: one working GPU clears `all_gpus_idle_since` (and the warning), so an active job is never touched.
    The ids of the jobs ended."""
    candidates = list(
        JobEfficiency.objects.filter(
            job__cluster=cluster,
            job__state=JobState.RUNNING,
            job__cancel_requested_at__isnull=True,
            job__is_external=False,
            all_gpus_idle_since__isnull=False,
            ended_at__isnull=True,
            job__project__efficiency_policy__end_idle_jobs=True,
        ).values_list(
            "job_id",
            "all_gpus_idle_since",
            "job__project__efficiency_policy__end_after_idle_seconds",
            "job__project__efficiency_policy__warning_seconds",
            "warned_at",
        )
    )
    ended: list[uuid.UUID] = []
    for job_id, idle_since, limit_seconds, warning_seconds, warned_at in candidates:
        assert idle_since is not None
        idle_seconds = (now - idle_since).total_seconds()
        if warned_at is None and idle_seconds >= max(limit_seconds - warning_seconds, 0):
            _warn(job_id=job_id, now=now, limit_seconds=limit_seconds)
        elif warned_at is not None and idle_seconds >= limit_seconds and _end(job_id=job_id, now=now):
            ended.append(job_id)
    return ended


def _locked_idle(job_id: uuid.UUID) -> JobEfficiency | None:
    """The job's efficiency row, locked, while the job still runs idle and has not been ended."""
    return (
        JobEfficiency.objects.select_for_update(of=("self",))
        .select_related("job__project__tenant", "job__cluster", "job__user")
        .filter(job_id=job_id, all_gpus_idle_since__isnull=False, ended_at__isnull=True, job__state=JobState.RUNNING)
        .first()
    )


def _warn(*, job_id: uuid.UUID, now: datetime, limit_seconds: int) -> None:
    with transaction.atomic():
        efficiency = _locked_idle(job_id)
        if efficiency is None or efficiency.warned_at is not None:
            return
        job = efficiency.job
        assert efficiency.all_gpus_idle_since is not None
        end_at = efficiency.all_gpus_idle_since + timedelta(seconds=limit_seconds)
        words = _idle_words(job, efficiency, now=now)
        detail = (
            f"Warned: {words}; the project ends jobs idle for {_minutes(limit_seconds)}, so this one ends at "
            f"{end_at:%Y-%m-%d %H:%M} UTC unless its GPUs work again"
        )
        efficiency.warned_at = now
        efficiency.save(update_fields=["warned_at"])
        _record_and_tell(job, detail, now=now, kind="job.gpu_idle_warning", title="will be ended: its GPUs are idle")


def _end(*, job_id: uuid.UUID, now: datetime) -> bool:
    with transaction.atomic():
        efficiency = _locked_idle(job_id)
        if efficiency is None or efficiency.warned_at is None:
            return False
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job_id)
        if job.cancel_requested_at is not None or job.state != JobState.RUNNING:
            return False
        detail = f"Ended by the project's idle-GPU policy: {_idle_words(job, efficiency, now=now)}"
        efficiency.ended_at = now
        efficiency.save(update_fields=["ended_at"])
        job.cancel_requested_at = now
        job.cancel_reason = detail[:500]  # no user asked: pages say "the portal" cancelled it, and why
        job.updated_at = now
        job.save(update_fields=["cancel_requested_at", "cancel_reason", "updated_at"])
        task_enqueue_on_commit("jobs.tasks.job_cancel", str(job.pk), fallback="the job sync cancels it")
        _record_and_tell(job, detail, now=now, kind="job.gpu_idle_ended", title="was ended: its GPUs were idle")
    return True


def _record_and_tell(job: Job, detail: str, *, now: datetime, kind: str, title: str) -> None:
    """The policy's step in the job's timeline (its state unchanged), its owner told, its watchers updated."""
    JobTransition.objects.create(job=job, from_state=job.state, to_state=job.state, at=now, detail=detail[:500])
    _changed(job.pk, now=now)
    _tell_owner(job, kind=kind, title=f"Job {job.name} {title}", body=f"Job {job.name} of {job.project}: {detail}.")
    transaction.on_commit(lambda: jobs_push([job.pk]))
