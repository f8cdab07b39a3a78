"""The GPU-minute limit (GrpTRESMins=gres/gpu) of each project's Slurm account, kept equal to its allocations.

The portal checks a job's GPU-hours when it is submitted through the portal; the limit in Slurm is what holds a
job submitted straight to Slurm (sbatch on a login node, slurmrestd) to the same allocations. Slurm's usage
counter for an account never resets on these clusters, so the limit is cumulative: see
`quotas.services.quota_expected_limit`. It changes when hours are granted (a task writes it at once), when a
period ends or starts, and when charges land on past periods (the periodic run writes those within a minute).

Order of row locks, everywhere: the project's `ProjectSlurmAccount` row, then its `QuotaLimitState` row. The
first serialises with the account sync and reconcile (writing a limit on Slurm 22.05 moves the account to root
and back, which they must not see half done); the second makes the last writer the one that computed last.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from clusters.accounts import Finding, attempt, slurm_associations_lock
from clusters.clients import slurm_client_for
from clusters.models import Cluster, ProjectSlurmAccount, SlurmDriftKind
from clusters.selectors import ProjectSlurmTarget
from clusters.slurm import SlurmClient, SlurmError, SlurmNotFound
from clusters.slurm.types import AssociationInfo
from quotas.models import Allocation, LedgerEntry, LedgerKind, QuotaLimitState
from quotas.services import quota_carry_over, quota_expected_limit, quota_expected_limits
from quotas.units import gpu_seconds_to_limit_minutes
from tenants.models import Project

logger = logging.getLogger(__name__)

# Earlier than any job of any account: the opening usage is everything Slurm's accounting holds.
ACCOUNTING_BEGINNING = datetime(2000, 1, 1, tzinfo=UTC)


class LimitOutcome:
    """What one limit sync did (plain strings: they go into logs and test assertions)."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"  # Slurm already holds the expected value, as last written
    NO_ACCOUNT = "no_account"  # the project's account does not exist on the cluster yet
    FAILED = "failed"


@dataclass(frozen=True)
class LimitSync:
    project_id: int
    cluster_id: int
    outcome: str
    expected_minutes: int | None = None
    error: str = ""
    retryable: bool = False  # the cluster did not answer: its other limits wait for the next run


@dataclass
class LimitsSyncSummary:
    carried_over: int = 0
    checked: int = 0
    results: list[LimitSync] = field(default_factory=list)

    @property
    def written(self) -> int:
        return sum(1 for result in self.results if result.outcome == LimitOutcome.WRITTEN)


# Reads ---------------------------------------------------------------------------------------------------


def quota_limit_state_ensure(*, project_id: int, cluster_id: int) -> QuotaLimitState:
    state, _ = QuotaLimitState.objects.get_or_create(project_id=project_id, cluster_id=cluster_id)
    return state


def quota_limit_expected_minutes(*, state: QuotaLimitState, now: datetime) -> int:
    """The GPU-minutes Slurm should hold for the state's project and cluster (DB only)."""
    limit = quota_expected_limit(
        project_id=state.project_id,
        cluster_id=state.cluster_id,
        opening_gpu_seconds=state.opening_gpu_seconds,
        now=now,
    )
    return gpu_seconds_to_limit_minutes(limit.gpu_seconds)


def quota_limited_pairs(*, cluster_ids: list[int] | None = None) -> set[tuple[int, int]]:
    """(project, cluster) pairs whose account carries a portal-managed limit: those with an allocation or a
    limit state, on active clusters."""
    active = Cluster.objects.filter(is_active=True)
    if cluster_ids is not None:
        active = active.filter(pk__in=cluster_ids)
    allocated = Allocation.objects.filter(cluster__in=active).values_list("project_id", "cluster_id").distinct()
    tracked = QuotaLimitState.objects.filter(cluster__in=active).values_list("project_id", "cluster_id")
    return set(allocated) | set(tracked)


# Opening usage -------------------------------------------------------------------------------------------


def quota_limit_opening_measure(*, state: QuotaLimitState, account: str, cluster: Cluster, client: SlurmClient) -> None:
    """Record the GPU-seconds Slurm's accounting holds for the account from before the portal tracked it.

    Slurm's usage counter includes them, so the limit must too. Jobs the ledger has charged already are left
    out: they are in the limit through their charge.
    """
    records = client.accounting_jobs(account=account, start_time=ACCOUNTING_BEGINNING)
    before = [
        record
        for record in records
        if record.end_time is not None
        and record.end_time < state.tracking_started_at
        and record.account == account
        and record.cluster in {"", cluster.name}
    ]
    charged = set(
        LedgerEntry.objects.filter(
            kind=LedgerKind.CHARGE,
            cluster=cluster,
            job__slurm_job_id__in=[record.job_id for record in before],
        ).values_list("job__slurm_job_id", flat=True)
    )
    state.opening_gpu_seconds = sum(record.gpu_seconds for record in before if record.job_id not in charged)
    state.opening_measured = True
    state.save(update_fields=["opening_gpu_seconds", "opening_measured"])


# Writing the limit ---------------------------------------------------------------------------------------


def _account_exists(row: ProjectSlurmAccount | None) -> bool:
    # The workers create the account on the first sync of the project; until one has succeeded (or found
    # it), there is nothing to write a limit on. A row in error after a sync may still have its account:
    # Slurm answers "not found" if not, which is handled as the same skip.
    return row is not None and row.synced_at is not None


def quota_limit_sync(
    *, project_id: int, cluster_id: int, now: datetime | None = None, client: SlurmClient | None = None
) -> LimitSync:
    """Write the project's expected GPU-minute limit into its account on the cluster, and record it.

    Measures the account's opening usage the first time. Skips, without an error, while the account does not
    exist yet (its creation carries the limit). Slurm's failures are recorded in `last_error` and not raised:
    the periodic run writes every limit that differs from the one applied, so it tries again within a minute.
    """
    cluster = Cluster.objects.filter(pk=cluster_id, is_active=True).first()
    project = Project.objects.filter(pk=project_id).first()
    if cluster is None or project is None:
        return LimitSync(project_id=project_id, cluster_id=cluster_id, outcome=LimitOutcome.NO_ACCOUNT)
    quota_limit_state_ensure(project_id=project_id, cluster_id=cluster_id)
    client = client or slurm_client_for(cluster)
    with transaction.atomic():
        slurm_associations_lock(cluster_id=cluster.pk)
        row = (
            ProjectSlurmAccount.objects.select_for_update(of=("self",), no_key=True)
            .filter(project_id=project_id, cluster=cluster)
            .first()
        )
        state = QuotaLimitState.objects.select_for_update(of=("self",), no_key=True).get(
            project_id=project_id, cluster=cluster
        )
        if not _account_exists(row):
            return LimitSync(project_id=project_id, cluster_id=cluster_id, outcome=LimitOutcome.NO_ACCOUNT)
        return _write_locked(state=state, project=project, cluster=cluster, client=client, now=now or timezone.now())


def _write_locked(
    *, state: QuotaLimitState, project: Project, cluster: Cluster, client: SlurmClient, now: datetime
) -> LimitSync:
    account = project.slurm_account
    expected: int | None = None
    try:
        if not state.opening_measured:
            quota_limit_opening_measure(state=state, account=account, cluster=cluster, client=client)
        expected = quota_limit_expected_minutes(state=state, now=now)
        if expected == state.applied_minutes and not state.last_error:
            # Already there (e.g. the account was just created with it). On 22.05 every write moves the account
            # to root and back; moves that race other association changes have left slurmdbd's tree broken, so
            # none is made that changes nothing. A limit changed in Slurm behind the portal's back is the
            # reconcile's to find, which reads every limit back.
            return LimitSync(
                project_id=project.pk, cluster_id=cluster.pk, outcome=LimitOutcome.UNCHANGED, expected_minutes=expected
            )
        client.set_account_gpu_minutes_limit(account=account, cluster=cluster.name, minutes=expected)
    except SlurmNotFound as exc:
        logger.info("project %s on cluster %s: no account to limit yet: %s", project, cluster.name, exc)
        return LimitSync(project_id=project.pk, cluster_id=cluster.pk, outcome=LimitOutcome.NO_ACCOUNT)
    except SlurmError as exc:
        when = "did not answer" if exc.retryable else "refused"
        state.last_error = (
            f"Slurm on cluster {cluster.name} {when} while writing GrpTRESMins=gres/gpu={expected} on {account}: "
            f"{exc}. The periodic limit sync tries again within a minute."
        )
        state.save(update_fields=["last_error"])
        logger.warning("project %s on cluster %s: %s", project, cluster.name, state.last_error)
        return LimitSync(
            project_id=project.pk,
            cluster_id=cluster.pk,
            outcome=LimitOutcome.FAILED,
            expected_minutes=expected,
            error=state.last_error,
            retryable=exc.retryable,
        )
    quota_limit_record_applied(state=state, minutes=expected)
    logger.info("project %s on cluster %s: GrpTRESMins=gres/gpu=%d", project, cluster.name, expected)
    return LimitSync(
        project_id=project.pk, cluster_id=cluster.pk, outcome=LimitOutcome.WRITTEN, expected_minutes=expected
    )


def quota_limit_record_applied(*, state: QuotaLimitState, minutes: int) -> None:
    """Remember what Slurm now holds (read back by the client); call with the state row locked."""
    state.applied_minutes = minutes
    state.applied_at = timezone.now()
    state.last_error = ""
    state.save(update_fields=["applied_minutes", "applied_at", "last_error"])


def quota_limit_for_new_account(*, project_id: int, cluster: Cluster, client: SlurmClient, now: datetime) -> int:
    """The limit to create a project's account with (call with its `ProjectSlurmAccount` row locked).

    A project without allocations gets its opening usage, that is no room: no allocation, no GPU-hours, in
    Slurm too. The account's accounting is measured first, in case an account of that name ran jobs before.
    """
    quota_limit_state_ensure(project_id=project_id, cluster_id=cluster.pk)
    state = QuotaLimitState.objects.select_for_update(of=("self",), no_key=True).get(
        project_id=project_id, cluster=cluster
    )
    if not state.opening_measured:
        account = Project.objects.values_list("slurm_account", flat=True).get(pk=project_id)
        quota_limit_opening_measure(state=state, account=account, cluster=cluster, client=client)
    return quota_limit_expected_minutes(state=state, now=now)


def quota_limit_created(*, project_id: int, cluster: Cluster, minutes: int) -> None:
    """Record the limit an account was just created with."""
    state = QuotaLimitState.objects.select_for_update(of=("self",), no_key=True).get(
        project_id=project_id, cluster=cluster
    )
    quota_limit_record_applied(state=state, minutes=minutes)


# The periodic run ----------------------------------------------------------------------------------------


def quota_limits_sync_all(*, now: datetime | None = None, cluster_ids: list[int] | None = None) -> LimitsSyncSummary:
    """Roll periods over and write every limit that differs from the one last applied.

    Runs every minute: first the open reservations of ended periods move into the next ones, then each
    (project, cluster) pair's expected limit is computed from the database and compared with `applied_minutes`.
    Only pairs that differ (a period started or ended, a charge landed on a past period, an earlier write
    failed, or none was ever applied) cost Slurm requests, so a run where nothing changed makes none.
    """
    now = now or timezone.now()
    summary = LimitsSyncSummary(carried_over=quota_carry_over(now=now))
    pairs = quota_limited_pairs(cluster_ids=cluster_ids)
    states = {
        (state.project_id, state.cluster_id): state
        for state in QuotaLimitState.objects.filter(
            Q(project_id__in={project_id for project_id, _ in pairs})
            & Q(cluster_id__in={cluster_id for _, cluster_id in pairs})
        )
    }
    created_accounts = set(
        ProjectSlurmAccount.objects.filter(
            project_id__in={project_id for project_id, _ in pairs}, synced_at__isnull=False
        ).values_list("project_id", "cluster_id")
    )
    clusters = {cluster.pk: cluster for cluster in Cluster.objects.filter(pk__in={pk for _, pk in pairs})}
    # Every measured pair's expected limit in one query; the others are synced (and measured) one by one below.
    measured = {pair: state.opening_gpu_seconds for pair, state in states.items() if state.opening_measured}
    expected = quota_expected_limits(openings=measured, now=now) if measured else {}
    unreachable: set[int] = set()
    for project_id, cluster_id in sorted(pairs):
        summary.checked += 1
        if (project_id, cluster_id) not in created_accounts or cluster_id in unreachable:
            continue  # no account yet (its creation carries the limit), or its cluster is down
        state = states.get((project_id, cluster_id))
        limit = expected.get((project_id, cluster_id))
        if (
            state is not None
            and limit is not None
            and state.applied_minutes is not None
            and gpu_seconds_to_limit_minutes(limit.gpu_seconds) == state.applied_minutes
        ):
            continue
        result = quota_limit_sync(
            project_id=project_id, cluster_id=cluster_id, now=now, client=slurm_client_for(clusters[cluster_id])
        )
        summary.results.append(result)
        if result.retryable:
            # Each further request would wait out the timeout too; the next run starts over.
            unreachable.add(cluster_id)
    if summary.results or summary.carried_over:
        failed = sum(1 for result in summary.results if result.outcome == LimitOutcome.FAILED)
        logger.log(
            logging.WARNING if failed else logging.INFO,
            "quota limits: %d reservation(s) carried over, %d of %d limit(s) written, %d failed",
            summary.carried_over,
            summary.written,
            summary.checked,
            failed,
        )
    return summary


# The policy the Slurm account sync applies (registered in QuotasConfig.ready) -------------------------------


class QuotaAccountLimits:
    """Project accounts' GPU-minute limits follow their allocations: see `clusters.accounts.AccountLimits`."""

    def for_new_account(self, *, project_id: int, cluster: Cluster, client: SlurmClient, now: datetime) -> int | None:
        return quota_limit_for_new_account(project_id=project_id, cluster=cluster, client=client, now=now)

    def created(self, *, project_id: int, cluster: Cluster, minutes: int) -> None:
        quota_limit_created(project_id=project_id, cluster=cluster, minutes=minutes)

    def drift(
        self,
        *,
        cluster: Cluster,
        client: SlurmClient,
        targets: list[ProjectSlurmTarget],
        own: Mapping[str, AssociationInfo],
        snapshot_at: datetime,
    ) -> list[Finding]:
        return _limit_drift(cluster=cluster, client=client, targets=targets, own=own, snapshot_at=snapshot_at)


def _limit_drift(
    *,
    cluster: Cluster,
    client: SlurmClient,
    targets: list[ProjectSlurmTarget],
    own: Mapping[str, AssociationInfo],
    snapshot_at: datetime,
) -> list[Finding]:
    """Compare the GPU-minute limit of each project account with allocations or a limit state on the cluster
    with what its allocations give, and write the expected one where they differ.

    Accounts created in this run are not in the snapshot and were created with their limit; an account moved
    in this run carried the limit the snapshot shows.
    """
    limited = {project_id for project_id, _ in quota_limited_pairs(cluster_ids=[cluster.pk])}
    findings = []
    for target in targets:
        association = own.get(target.account)
        if target.project_id not in limited or association is None:
            continue
        finding = _limit_in_line(
            cluster=cluster, client=client, target=target, own=association, snapshot_at=snapshot_at
        )
        if finding is not None:
            findings.append(finding)
    return findings


def _limit_in_line(
    *, cluster: Cluster, client: SlurmClient, target: ProjectSlurmTarget, own: AssociationInfo, snapshot_at: datetime
) -> Finding | None:
    quota_limit_state_ensure(project_id=target.project_id, cluster_id=cluster.pk)
    with transaction.atomic():
        # A sync or limit write holding the rows is changing the account right now; skip it this run.
        if not slurm_associations_lock(cluster_id=cluster.pk, wait=False):
            return None
        row = (
            ProjectSlurmAccount.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
            .filter(project_id=target.project_id, cluster=cluster)
            .first()
        )
        state = (
            QuotaLimitState.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
            .filter(project_id=target.project_id, cluster=cluster)
            .first()
        )
        if row is None or state is None or (state.applied_at is not None and state.applied_at > snapshot_at):
            return None  # a limit written after the associations were read: the snapshot is stale for it
        if not state.opening_measured:
            quota_limit_opening_measure(state=state, account=target.account, cluster=cluster, client=client)
        expected = quota_limit_expected_minutes(state=state, now=timezone.now())
        found = own.gpu_minutes_limit
        if found == expected:
            if state.applied_minutes != expected:
                quota_limit_record_applied(state=state, minutes=expected)
            return None
        shown = f"GrpTRESMins=gres/gpu={found}" if found is not None else "no GrpTRESMins for gres/gpu"
        detail = f"Slurm has {shown} on {target.account}, the allocations of {target.project_label} say {expected}."
        if found is not None and found == state.applied_minutes:
            detail += " (The portal wrote that value; the periodic limit sync had not written the new one yet.)"
        finding = Finding(SlurmDriftKind.GPU_LIMIT, account=target.account, detail=detail)
        write = partial(
            client.set_account_gpu_minutes_limit, account=target.account, cluster=cluster.name, minutes=expected
        )
        if attempt(finding, write):
            quota_limit_record_applied(state=state, minutes=expected)
        else:
            state.last_error = finding.detail
            state.save(update_fields=["last_error"])
    return finding
