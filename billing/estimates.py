"""Cost estimates: the most a job can cost (its GPUs for its whole time limit, at the rate in force now) and
what it leaves of the project's allocation.

One estimate answers POST /api/v1/estimates/ before a submission and rides on the submit reply after it, so
both say the same: the GPU-hours are what the job reserves (`quotas.services.job_gpu_seconds_needed`), the
allocation is the one it draws on, and the shape (partition, GPU type, defaults) is resolved by
`jobs.job_services`, exactly as a submission resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from billing.models import Rate
from billing.money import amount_billed, usage_cost
from billing.rates import RateBook
from clusters.models import Partition
from jobs.job_services import Accepted, JobRequest, expected_gpu_type, job_shape_resolve
from jobs.models import Job
from quotas.models import Allocation, LedgerEntry, LedgerKind
from quotas.services import (
    allocation_for,
    allocation_requests_path,
    allocations_current,
    array_tasks_that_fit,
    job_gpu_seconds_needed,
    open_reservations_of,
    quota_refusal,
    task_gpu_seconds_needed,
)
from quotas.units import gpu_seconds_to_hours
from tenants.models import Project


@dataclass(frozen=True)
class Estimate:
    """The most a job of one shape can cost and use. `remaining_gpu_seconds` is the allocation's balance before
    the job; `gpu_type` is the type its GPUs will have ("" when any type may come), which picks rate and allocation."""

    project: Project
    cluster_name: str
    partition: str
    gpu_type: str
    gpus: int
    time_limit_minutes: int
    gpu_seconds: int
    rate: Rate | None
    max_cost: Decimal | None
    allocation: Allocation | None
    remaining_gpu_seconds: int | None
    # Before a submission: the refusal a submission of this shape would get now, in the submission's own words
    # (`quotas.services.quota_refusal`); empty when it would be accepted, or for a job already accepted.
    refusal: str = ""
    array_task_count: int = 0
    task_gpu_seconds: int = 0  # one task's share of `gpu_seconds`
    node_count: int = 1  # `gpus` is per node

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.node_count

    @property
    def array_tasks_that_fit(self) -> int | None:
        if not self.array_task_count:
            return None
        if self.remaining_gpu_seconds is None:
            return 0
        return array_tasks_that_fit(
            task_gpu_seconds=self.task_gpu_seconds,
            task_count=self.array_task_count,
            remaining_gpu_seconds=self.remaining_gpu_seconds,
        )

    @property
    def remaining_after_gpu_seconds(self) -> int | None:
        return None if self.remaining_gpu_seconds is None else self.remaining_gpu_seconds - self.gpu_seconds

    @property
    def fits(self) -> bool:
        if self.refusal:
            return False
        return self.remaining_gpu_seconds is not None and self.gpu_seconds <= self.remaining_gpu_seconds

    @property
    def message(self) -> str:
        if self.refusal:
            return f"{self._cost_sentence()}; but it would be refused: {self.refusal}"
        return f"{self._cost_sentence()}; {self._allocation_sentence()}."

    def _cost_sentence(self) -> str:
        shape = f" ({self.node_count} nodes x {self.gpus} GPUs)" if self.node_count > 1 else ""
        hours = (
            f"At most {gpu_seconds_to_hours(self.gpu_seconds)} GPU-hours{shape} on {self.gpu_type or 'any GPU type'}"
        )
        if self.rate is None:
            kind = f"{self.gpu_type} GPUs" if self.gpu_type else "GPUs without a type"
            return (
                f"{hours}, with no cost estimate: prices are not set for {kind} on cluster {self.cluster_name} "
                "(a portal admin sets them)"
            )
        price = f"{self.rate.price_per_gpu_hour} {self.rate.currency}/GPU-hour"
        return f"{hours} at {price}: up to {self.max_cost} {self.rate.currency}"

    def _allocation_sentence(self) -> str:
        if self.allocation is None or self.remaining_gpu_seconds is None:
            kind = f" for {self.gpu_type} GPUs" if self.gpu_type else ""
            return (
                f"but {self.project.slug} has no GPU-hour allocation open today on cluster {self.cluster_name}{kind}, "
                "so it would be refused: ask your tenant admin or a portal admin for one"
            )
        until = self.allocation.ends_on.isoformat()
        before = gpu_seconds_to_hours(self.remaining_gpu_seconds)
        if not self.fits:
            left = gpu_seconds_to_hours(max(self.remaining_gpu_seconds, 0))
            if self.array_task_count:
                fitting = self.array_tasks_that_fit
                return (
                    f"but only {left} GPU-hours are left until {until}, enough for {fitting} of its "
                    f"{self.array_task_count} tasks, so it would be refused: ask for at most {fitting} "
                    "tasks, fewer GPUs or a shorter time limit, or request more at "
                    f"{allocation_requests_path(self.allocation)}"
                )
            return (
                f"but only {left} GPU-hours are left until {until}, "
                "so it would be refused: ask for fewer GPUs or a shorter time limit, or request more at "
                f"{allocation_requests_path(self.allocation)}"
            )
        after = gpu_seconds_to_hours(self.remaining_gpu_seconds - self.gpu_seconds)
        return f"leaves {after} of {before} GPU-hours until {until}"


def _priced(
    *,
    job: Job,
    gpu_type: str,
    allocation: Allocation | None,
    remaining: int | None,
    now: datetime,
    rates: RateBook | None = None,
    refusal: str = "",
) -> Estimate:
    rates = rates or RateBook.for_clusters([job.cluster_id])
    rate = rates.in_force(cluster_id=job.cluster_id, gpu_type=gpu_type, at=now)
    gpu_seconds = job_gpu_seconds_needed(job)
    # At the one rate in force now, the job's usage makes one invoice line: rounded as the invoice will round it.
    max_cost = (
        amount_billed(
            line_costs=[usage_cost(gpu_seconds=gpu_seconds, price_per_gpu_hour=rate.price_per_gpu_hour)],
            currency=rate.currency,
        )
        if rate is not None
        else None
    )
    return Estimate(
        project=job.project,
        cluster_name=job.cluster.name,
        partition=job.partition,
        gpu_type=gpu_type,
        gpus=job.gpus,
        time_limit_minutes=job.time_limit_minutes,
        gpu_seconds=gpu_seconds,
        rate=rate,
        max_cost=max_cost,
        allocation=allocation,
        remaining_gpu_seconds=remaining,
        refusal=refusal,
        array_task_count=job.array_task_count,
        task_gpu_seconds=task_gpu_seconds_needed(job),
        node_count=job.node_count,
    )


def estimate_for_request(*, project: Project, request: JobRequest, now: datetime | None = None) -> Estimate:
    """What a submission of `request` to `project` would reserve and cost at most, without storing anything.

    The caller has checked that the user may view the project. Raises ValidationError for a shape that a
    submission would refuse (unknown cluster or partition, too many GPUs, too long a time limit).
    """
    now = now or timezone.now()
    shape = job_shape_resolve(project=project, request=request)
    # Unsaved: the reservation's own arithmetic then applies to the estimate unchanged.
    job = Job(
        project=project,
        cluster=shape.cluster,
        partition=shape.partition,
        gpu_type=shape.gpu_type,
        gpus=shape.gpus,
        node_count=shape.node_count,
        time_limit_minutes=shape.time_limit_minutes,
        array_task_count=shape.array_task_count,
    )
    candidates = allocations_current(project_id=project.pk, cluster_id=shape.cluster.pk, now=now)
    allocation = allocation_for(candidates=candidates, gpu_type=shape.expected_gpu_type)
    remaining = allocation.remaining_gpu_seconds if allocation is not None else None
    refusal = quota_refusal(job=job, gpu_type=shape.expected_gpu_type, candidates=candidates)
    return _priced(
        job=job,
        gpu_type=shape.expected_gpu_type or "",
        allocation=allocation,
        remaining=remaining,
        now=now,
        refusal=str(refusal) if refusal is not None else "",
    )


def job_estimate(*, job: Job, now: datetime | None = None) -> Estimate:
    """The estimate of an accepted job. Its reservation is already taken from the allocation, so the balance
    "before" is today's remaining plus that reservation, and "after" is today's remaining."""
    now = now or timezone.now()
    partition = Partition.objects.filter(cluster_id=job.cluster_id, name=job.partition).first()
    gpu_type = expected_gpu_type(gpu_type=job.gpu_type or None, partition=partition) or ""
    entries = list(
        LedgerEntry.objects.filter(job=job, kind__in=[LedgerKind.RESERVE, LedgerKind.RELEASE])
        .select_related("allocation")
        .order_by("id")
    )
    reservations = [entry for entry in entries if entry.kind == LedgerKind.RESERVE]
    if not reservations:
        return _priced(job=job, gpu_type=gpu_type, allocation=None, remaining=None, now=now)
    reservation = reservations[-1]  # a job carried into the next period holds its reservation there
    allocation = reservation.allocation
    assert allocation is not None, "a reservation always belongs to an allocation"
    # What the job still holds there (an array: the reservations of its tasks that have not ended).
    held = sum(
        entry.gpu_seconds for entry in open_reservations_of(entries) if entry.allocation_id == reservation.allocation_id
    )
    return _priced(
        job=job, gpu_type=gpu_type, allocation=allocation, remaining=allocation.remaining_gpu_seconds + held, now=now
    )


def estimate_data(estimate: Estimate) -> dict[str, Any]:
    """The estimate as `billing.estimate_apis.EstimateOutput` renders it."""
    rate = estimate.rate
    allocation = estimate.allocation
    return {
        "project": f"{estimate.project.tenant.slug}/{estimate.project.slug}",
        "cluster": estimate.cluster_name,
        "partition": estimate.partition,
        "gpu_type": estimate.gpu_type,
        "gpus": estimate.gpus,
        "nodes": estimate.node_count,
        "total_gpus": estimate.total_gpus,
        "time_limit_minutes": estimate.time_limit_minutes,
        "array_tasks": estimate.array_task_count,
        "array_tasks_that_fit": estimate.array_tasks_that_fit,
        "gpu_hours": gpu_seconds_to_hours(estimate.gpu_seconds),
        "rate": None
        if rate is None
        else {
            "id": rate.pk,
            "gpu_type": rate.gpu_type,
            "price_per_gpu_hour": rate.price_per_gpu_hour,
            "currency": rate.currency,
            "valid_from": rate.valid_from,
        },
        "max_cost": estimate.max_cost,
        "currency": rate.currency if rate is not None else None,
        "allocation": None
        if allocation is None or estimate.remaining_gpu_seconds is None
        else {
            "id": allocation.pk,
            "gpu_type": allocation.gpu_type,
            "ends_on": allocation.ends_on,
            "remaining_gpu_hours": gpu_seconds_to_hours(estimate.remaining_gpu_seconds),
            "remaining_after_gpu_hours": gpu_seconds_to_hours(estimate.remaining_gpu_seconds - estimate.gpu_seconds),
        },
        "fits": estimate.fits,
        "message": estimate.message,
    }


def job_estimate_accepted(*, accepted: Accepted) -> Estimate:
    """`job_estimate` of a job just accepted, from what its submission stored (no reads but the cached rates)."""
    job, reservation = accepted.job, accepted.reservation
    allocation = reservation.allocation if reservation is not None else None
    return _priced(
        job=job,
        gpu_type=accepted.quota_gpu_type or "",
        allocation=allocation,
        remaining=None
        if reservation is None
        else reservation.allocation.remaining_gpu_seconds + reservation.gpu_seconds,
        now=job.created_at,
        rates=RateBook.for_estimates(job.cluster_id),
    )


def job_estimate_data(accepted: Accepted) -> dict[str, Any]:
    """The submit reply's `estimate` (settings.JOB_ESTIMATE_FUNCTION): the same rendering as POST /estimates/."""
    # The reply's shape lives with the API, which imports this module: imported here, when first needed.
    from billing.estimate_apis import EstimateOutput

    return dict(EstimateOutput(estimate_data(job_estimate_accepted(accepted=accepted))).data)
