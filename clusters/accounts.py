"""Slurm accounts for tenants and projects: syncing one project everywhere, and reconciling one cluster.

In Slurm, on every active cluster: `root` -> `t_<tenant>` (the tenant's parent account) -> `<tenant>_<project>`,
with one user association on the project's account for each active manager or member of the project who has
a username on that cluster (`ClusterAccount`), and no other. Nobody is associated with a tenant's parent
account. The portal creates and moves accounts and adds and removes associations; it never deletes an
account. Runs only in Celery workers (it builds Slurm clients, which read the cluster's key).

Slurm 22.05 (slurmrestd v0.0.38) behaviours measured on the local cluster, which the code relies on:

- Removing the association that is a user's *default account* is not refused (ColdFront #274 does not
  happen on 22.05.8), through slurmrestd's `DELETE /association` and `sacctmgr delete user U account=A`
  alike, even while the user has other associations. Slurm switches no default: the user is left with
  none. The portal's jobs always name their account and keep running; a bare `sbatch` on a login node fails
  with "Invalid account or account/partition combination specified" until the user's next new association,
  which Slurm makes their default. v0.0.38 gives no way to set a default (`POST /users` with
  `default.account` answers 200, creates the user record and sets nothing), so the portal leaves it there.
- Removing an association (or deleting an account) while jobs are running or pending in it is refused with
  error 7001 "Job(s) active, cancel job(s) before remove" (once slurmdbd has heard of the job, a moment after
  its submission), which the client classes as retryable. Jobs may run for days, so the sync does not retry
  it: the account is marked pending with that message, and the periodic reconcile removes the association
  once the jobs have ended.
- `GET /associations?account=A` answers HTTP 500 with error 9003 "Nothing found with query: Nothing found"
  when no association matches, instead of an empty list.
- Creating an account that exists succeeds and *moves* its association under the parent given, users and
  all: creating is also how an account found under the wrong parent is moved back (carrying its GPU-minute
  limit, which the client verifies). Creating one under a parent that does not exist leaves the account
  record behind and fails with error -1 "Unspecified error", so a project's account is only created once its
  tenant's parent account exists.
- Moving an account that has a GPU-minute limit (0 included) with a request that does not carry a limit
  crashes slurmrestd 22.05.8 (segmentation fault, the connection closes without a reply); carrying the limit
  works. Every move here carries the limit the account has.
- Deleting an account deletes the associations of the accounts under it too.
- slurmdbd accepts associations for user names no machine knows (no POSIX check), and removing an
  association that does not exist succeeds: removals are idempotent.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from clusters.clients import slurm_client_for
from clusters.models import Cluster, ProjectSlurmAccount, SlurmDriftKind, SlurmDriftReport
from clusters.selectors import (
    ProjectSlurmTarget,
    cluster_list_active,
    project_account_names,
    project_slurm_targets,
    tenant_parent_account_names,
)
from clusters.slurm import SlurmClient, SlurmError, SlurmRetryableError
from clusters.slurm.types import AssociationInfo
from tenants.models import Project

logger = logging.getLogger(__name__)


class AccountLimits(Protocol):
    """The GPU-minute limits (GrpTRESMins) of project accounts. What they must be follows from the projects'
    allocations, which quotas/ owns: it registers its policy here when the app starts (`account_limits_register`),
    so this module writes limits without importing upwards."""

    def for_new_account(self, *, project_id: int, cluster: Cluster, client: SlurmClient, now: datetime) -> int | None:
        """The limit a project's account is created with; None for none."""

    def created(self, *, project_id: int, cluster: Cluster, minutes: int) -> None:
        """Record that the account was created with this limit."""

    def drift(
        self,
        *,
        cluster: Cluster,
        client: SlurmClient,
        targets: list[ProjectSlurmTarget],
        own: Mapping[str, AssociationInfo],
        snapshot_at: datetime,
    ) -> list[Finding]:
        """Compare (and repair) the limits on the accounts of `targets`, whose own associations are `own`."""


class _NoLimits:
    def for_new_account(self, *, project_id: int, cluster: Cluster, client: SlurmClient, now: datetime) -> int | None:
        return None

    def created(self, *, project_id: int, cluster: Cluster, minutes: int) -> None:
        return None

    def drift(
        self,
        *,
        cluster: Cluster,
        client: SlurmClient,
        targets: list[ProjectSlurmTarget],
        own: Mapping[str, AssociationInfo],
        snapshot_at: datetime,
    ) -> list[Finding]:
        return []


_account_limits: AccountLimits = _NoLimits()


def account_limits_register(limits: AccountLimits) -> None:
    """Set the policy for project accounts' GPU-minute limits (quotas' AppConfig.ready calls it)."""
    global _account_limits
    _account_limits = limits


ROOT_ACCOUNT = "root"
# Slurm error numbers (slurm_errno.h) this module treats specially.
_NOTHING_FOUND = 9003  # ESLURM_REST_EMPTY_RESULT
_JOBS_ACTIVE = 7001  # ESLURM_JOBS_RUNNING_ON_ASSOC
# A run every ten minutes per cluster adds ~4,300 reports a month; older ones have been acted on or never will be.
DRIFT_REPORT_RETENTION = timedelta(days=90)


@dataclass
class Finding:
    """One difference between the portal and Slurm, and whether it was repaired."""

    kind: SlurmDriftKind
    account: str
    user: str = ""
    detail: str = ""
    repaired: bool = False
    # Slurm refused a removal while jobs are active in the account; a later run will try again.
    waits_for_jobs: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "account": self.account,
            "user": self.user,
            "detail": self.detail,
            "repaired": self.repaired,
        }


@dataclass(frozen=True)
class _SlurmView:
    """The associations Slurm holds for some accounts on one cluster, read in one request."""

    own: dict[str, AssociationInfo]  # account -> its own (user-less) association
    users: dict[str, frozenset[str]]  # account -> users associated with it

    @classmethod
    def of(cls, associations: Iterable[AssociationInfo]) -> _SlurmView:
        own: dict[str, AssociationInfo] = {}
        users: dict[str, set[str]] = defaultdict(set)
        for association in associations:
            if association.user:
                users[association.account].add(association.user)
            else:
                own[association.account] = association
        return cls(own=own, users={account: frozenset(names) for account, names in users.items()})

    def users_of(self, account: str) -> frozenset[str]:
        return self.users.get(account, frozenset())


# Services ----------------------------------------------------------------------------------------------


def project_slurm_sync(*, project_id: int) -> None:
    """Bring the project's Slurm account and user associations in line with the portal on every active cluster.

    Idempotent, and a no-op for a project that no longer exists. A cluster that cannot be reached does not
    hold up the others: its error is raised after all clusters had their turn, so that the task retries.
    """
    if not Project.objects.filter(pk=project_id).exists():
        return
    clusters = list(cluster_list_active())
    if not _ensure_rows(project_ids=[project_id], clusters=clusters):
        return
    unreachable: SlurmRetryableError | None = None
    for cluster in clusters:
        error = _project_sync_on_cluster(project_id=project_id, cluster=cluster)
        unreachable = unreachable or error
    if unreachable is not None:
        raise unreachable


def cluster_slurm_reconcile(*, cluster_id: int) -> SlurmDriftReport:
    """Compare every project's accounts and associations on the cluster with the portal, repair what can be
    repaired, and record each difference found in a drift report.

    Reads all of the cluster's associations in one request. Accounts under a tenant's parent account (or a
    project's account) that no project uses are reported and left alone: the portal deletes nothing it did
    not create.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    started_at = timezone.now()
    report = SlurmDriftReport.objects.create(cluster=cluster, started_at=started_at)
    findings: list[Finding] = []
    projects_checked = 0
    try:
        projects_checked = _reconcile(cluster=cluster, client=slurm_client_for(cluster), findings=findings)
    except SlurmError as exc:
        # Retryable or not, the next scheduled run starts over; the report keeps what was done so far.
        report.error = f"The run stopped early: Slurm on cluster {cluster.name} failed: {exc}"
    report.findings = [finding.as_json() for finding in findings]
    report.finished_at = timezone.now()
    report.save(update_fields=["findings", "finished_at", "error"])
    SlurmDriftReport.objects.filter(cluster=cluster, started_at__lt=started_at - DRIFT_REPORT_RETENTION).delete()
    repaired = sum(1 for finding in findings if finding.repaired)
    logger.log(
        logging.WARNING if report.error or repaired < len(findings) else logging.INFO,
        "cluster %s: Slurm accounts reconciled over %d project(s): %d finding(s), %d repaired, %d left%s (report %d)",
        cluster.name,
        projects_checked,
        len(findings),
        repaired,
        len(findings) - repaired,
        f"; {report.error}" if report.error else "",
        report.pk,
    )
    return report


# One writer of a cluster's associations at a time -----------------------------------------------------------

# Namespace of the advisory locks below (the first of PostgreSQL's two lock keys; the cluster's id is the second).
_ASSOCIATIONS_LOCK_NAMESPACE = 0x534C  # "SL"


def slurm_associations_lock(*, cluster_id: int, wait: bool = True) -> bool:
    """Hold the cluster's association lock until the current transaction ends; False when `wait` is off and
    another transaction holds it.

    Every change of a cluster's accounts, associations and limits (a project's sync, the reconcile, the limit
    writes) takes it first, so they happen one at a time per cluster: on 22.05 a limit is changed by moving the
    account away and back, and moves that raced other association changes left slurmdbd's association tree
    broken ("Can't find parent id"), after which slurmdbd crashes on every move. An advisory lock, not a lock
    on the cluster's row: that one would also block (and deadlock with) every insert referencing the cluster.
    """
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)", [_ASSOCIATIONS_LOCK_NAMESPACE, cluster_id])
        row = cursor.fetchone()
    return wait or bool(row and row[0])


# Syncing one project -----------------------------------------------------------------------------------


def _ensure_rows(*, project_ids: Collection[int], clusters: Collection[Cluster]) -> bool:
    """Create the missing status rows; False when a project vanished meanwhile (a stale task)."""
    existing = set(
        ProjectSlurmAccount.objects.filter(project_id__in=project_ids, cluster__in=clusters).values_list(
            "project_id", "cluster_id"
        )
    )
    rows = [
        ProjectSlurmAccount(project_id=pk, cluster=cluster)
        for pk in project_ids
        for cluster in clusters
        if (pk, cluster.pk) not in existing
    ]
    if not rows:
        return True
    try:
        with transaction.atomic():
            ProjectSlurmAccount.objects.bulk_create(rows, ignore_conflicts=True)
    except IntegrityError:
        return False
    return True


def _project_sync_on_cluster(*, project_id: int, cluster: Cluster) -> SlurmRetryableError | None:
    client = slurm_client_for(cluster)
    findings: list[Finding] = []
    with transaction.atomic():
        slurm_associations_lock(cluster_id=cluster.pk)
        # The row lock serialises syncs of one project, and the memberships are read only once it is held:
        # an older sync cannot undo a newer one by applying memberships it read earlier.
        row = (
            ProjectSlurmAccount.objects.select_for_update(of=("self",), no_key=True)
            .filter(project_id=project_id, cluster=cluster)
            .first()
        )
        targets = project_slurm_targets(cluster=cluster, project_ids=[project_id])
        if row is None or not targets:
            return None
        target = targets[0]
        try:
            view = _read_associations(client=client, cluster=cluster, accounts=[target.parent_account, target.account])
            parent_findings, parent_usable = _parent_in_line(client=client, cluster=cluster, target=target, view=view)
            project_findings = _project_in_line(
                client=client, cluster=cluster, target=target, view=view, parent_usable=parent_usable
            )
            findings = parent_findings + project_findings
        except SlurmRetryableError as exc:
            row.last_error = f"Slurm on cluster {cluster.name} did not answer: {exc}. The sync will be retried."
            row.save(update_fields=["last_error"])
            logger.warning("project %s on cluster %s: sync failed, retrying: %s", target.project_label, cluster, exc)
            return exc
        except SlurmError as exc:
            row.state = ProjectSlurmAccount.State.ERROR
            row.last_error = f"Slurm on cluster {cluster.name} refused: {exc}"
            row.synced_at = timezone.now()
            row.save(update_fields=["state", "last_error", "synced_at"])
            logger.warning("project %s on cluster %s: sync failed: %s", target.project_label, cluster, exc)
            return None
        _record_outcome(row=row, cluster=cluster, target=target, findings=findings)
    for finding in findings:
        logger.info(
            "project %s on cluster %s: %s %s%s: %s",
            target.project_label,
            cluster.name,
            finding.kind.value,
            finding.account,
            f" user {finding.user}" if finding.user else "",
            "repaired" if finding.repaired else finding.detail,
        )
    return None


def _record_outcome(
    *, row: ProjectSlurmAccount, cluster: Cluster, target: ProjectSlurmTarget, findings: list[Finding]
) -> None:
    left = [finding for finding in findings if not finding.repaired]
    problems = [finding.detail for finding in left] + _username_notes(cluster=cluster, target=target)
    if any(not finding.waits_for_jobs for finding in left):
        row.state = ProjectSlurmAccount.State.ERROR
    elif left:
        row.state = ProjectSlurmAccount.State.PENDING
    else:
        row.state = ProjectSlurmAccount.State.READY
    row.last_error = "\n".join(problems)
    row.synced_at = timezone.now()
    row.save(update_fields=["state", "last_error", "synced_at"])


def _username_notes(*, cluster: Cluster, target: ProjectSlurmTarget) -> list[str]:
    return [
        f"{username} has no username on cluster {cluster.name}; a portal admin sets it under Cluster accounts."
        for username in target.members_without_username
    ]


# Comparing and repairing -------------------------------------------------------------------------------


def _read_associations(*, client: SlurmClient, cluster: Cluster, accounts: Collection[str] = ()) -> _SlurmView:
    """The cluster's associations, of the given accounts only when some are named, in one request."""
    try:
        associations = client.associations(account=",".join(sorted(accounts)) or None, cluster=cluster.name)
    except SlurmError as exc:
        if _has_error_number(exc, _NOTHING_FOUND):
            return _SlurmView.of(())
        raise
    wanted = set(accounts)
    return _SlurmView.of(a for a in associations if a.cluster == cluster.name and (not wanted or a.account in wanted))


def _parent_drift(*, cluster: Cluster, target: ProjectSlurmTarget, view: _SlurmView) -> list[Finding]:
    parent = target.parent_account
    own = view.own.get(parent)
    findings = []
    if own is None:
        detail = f"Tenant {target.tenant_slug}'s parent account {parent} does not exist on cluster {cluster.name}."
        findings.append(Finding(SlurmDriftKind.MISSING_PARENT_ACCOUNT, account=parent, detail=detail))
    elif own.parent_account != ROOT_ACCOUNT:
        detail = f"Tenant {target.tenant_slug}'s parent account {parent} is under {own.parent_account}, not under root."
        findings.append(Finding(SlurmDriftKind.WRONG_PARENT, account=parent, detail=detail))
    for user in sorted(view.users_of(parent)):
        detail = (
            f"{user} holds an association with tenant parent account {parent} on cluster {cluster.name}; "
            "the portal grants associations on project accounts only."
        )
        findings.append(Finding(SlurmDriftKind.EXTRA_USER_ASSOCIATION, account=parent, user=user, detail=detail))
    return findings


def _parent_in_line(
    *, client: SlurmClient, cluster: Cluster, target: ProjectSlurmTarget, view: _SlurmView
) -> tuple[list[Finding], bool]:
    """Repair the tenant's parent account; returns the findings and whether projects can be created under it."""
    findings = _parent_drift(cluster=cluster, target=target, view=view)
    own = view.own.get(target.parent_account)
    usable = own is not None  # an account under the wrong parent still works for its projects
    for finding in findings:
        if finding.kind is SlurmDriftKind.EXTRA_USER_ASSOCIATION:
            attempt(
                finding,
                partial(
                    client.remove_user_association, account=finding.account, user=finding.user, cluster=cluster.name
                ),
            )
            continue
        created = attempt(
            finding,
            partial(
                client.create_account,
                name=target.parent_account,
                cluster=cluster.name,
                description=target.tenant_name,
                organization=target.tenant_slug,
                parent_account=ROOT_ACCOUNT,
                gpu_minutes_limit=own.gpu_minutes_limit if own else None,
            ),
        )
        usable = usable or created
    return findings, usable


def _project_drift(*, cluster: Cluster, target: ProjectSlurmTarget, view: _SlurmView) -> list[Finding]:
    account = target.account
    own = view.own.get(account)
    findings = []
    if own is None:
        detail = f"Project {target.project_label}'s account {account} does not exist on cluster {cluster.name}."
        findings.append(Finding(SlurmDriftKind.MISSING_PROJECT_ACCOUNT, account=account, detail=detail))
    elif own.parent_account != target.parent_account:
        detail = (
            f"Project {target.project_label}'s account {account} is under {own.parent_account or 'no parent'}, "
            f"not under {target.parent_account}."
        )
        findings.append(Finding(SlurmDriftKind.WRONG_PARENT, account=account, detail=detail))
    associated = view.users_of(account)
    for user in sorted(target.cluster_usernames - associated):
        detail = (
            f"{user} is a manager or member of {target.project_label} but has no association with {account} "
            f"on cluster {cluster.name}."
        )
        findings.append(Finding(SlurmDriftKind.MISSING_USER_ASSOCIATION, account=account, user=user, detail=detail))
    for user in sorted(associated - target.cluster_usernames):
        detail = (
            f"{user} holds an association with {account} on cluster {cluster.name}, but no manager or member of "
            f"{target.project_label} has that username there."
        )
        findings.append(Finding(SlurmDriftKind.EXTRA_USER_ASSOCIATION, account=account, user=user, detail=detail))
    return findings


def _project_in_line(
    *, client: SlurmClient, cluster: Cluster, target: ProjectSlurmTarget, view: _SlurmView, parent_usable: bool
) -> list[Finding]:
    findings = _project_drift(cluster=cluster, target=target, view=view)
    own = view.own.get(target.account)
    account_usable = own is not None
    for finding in findings:
        if finding.kind in {SlurmDriftKind.MISSING_PROJECT_ACCOUNT, SlurmDriftKind.WRONG_PARENT}:
            if not parent_usable:
                finding.detail += f" Not repaired: the tenant's parent account {target.parent_account} is missing."
                continue
            created = attempt(
                finding,
                partial(_create_project_account, client=client, cluster=cluster, target=target, own=own),
            )
            account_usable = account_usable or created
        elif finding.kind is SlurmDriftKind.MISSING_USER_ASSOCIATION:
            if not account_usable:
                finding.detail += f" Not repaired: the account {target.account} is missing."
                continue
            attempt(
                finding,
                partial(client.add_user_association, account=target.account, user=finding.user, cluster=cluster.name),
            )
        elif finding.kind is SlurmDriftKind.EXTRA_USER_ASSOCIATION:
            attempt(
                finding,
                partial(
                    client.remove_user_association, account=target.account, user=finding.user, cluster=cluster.name
                ),
            )
    return findings


def _create_project_account(
    *, client: SlurmClient, cluster: Cluster, target: ProjectSlurmTarget, own: AssociationInfo | None
) -> None:
    """Create the project's account, or move it under its tenant's parent account (creating moves it).

    Moving carries the account's limit (the client checks the limit it reads back). A new account starts with
    the limit its allocations give; without allocations that is its opening usage, i.e. no room: GPU-hours
    exist in Slurm only through an allocation.
    Call with the project's `ProjectSlurmAccount` row locked.
    """
    if own is not None:
        limit = own.gpu_minutes_limit
    else:
        limit = _account_limits.for_new_account(
            project_id=target.project_id, cluster=cluster, client=client, now=timezone.now()
        )
    client.create_account(
        name=target.account,
        cluster=cluster.name,
        description=target.project_name,
        organization=target.tenant_slug,
        parent_account=target.parent_account,
        gpu_minutes_limit=limit,
    )
    if own is None and limit is not None:
        _account_limits.created(project_id=target.project_id, cluster=cluster, minutes=limit)


def attempt(finding: Finding, action: Callable[[], object]) -> bool:
    """Run one repair, recording the outcome on the finding; retryable failures propagate."""
    try:
        action()
    except SlurmError as exc:
        if _has_error_number(exc, _JOBS_ACTIVE):
            finding.waits_for_jobs = True
            finding.detail += (
                f" Not repaired yet: Slurm refuses while jobs are running or pending in {finding.account} "
                "('Job(s) active, cancel job(s) before remove'); the next reconcile tries again."
            )
            return False
        if exc.retryable:
            raise
        finding.detail += f" Slurm refused the repair: {exc}"
        return False
    finding.repaired = True
    return True


def _has_error_number(exc: SlurmError, number: int) -> bool:
    return any(message.error_number == number for message in exc.messages)


# Reconciling a cluster ---------------------------------------------------------------------------------


def _reconcile(*, cluster: Cluster, client: SlurmClient, findings: list[Finding]) -> int:
    """Append the findings of one run to `findings` (so a failed run keeps them); returns the projects checked."""
    snapshot_at = timezone.now()
    view = _read_associations(client=client, cluster=cluster)
    targets = project_slurm_targets(cluster=cluster)
    _ensure_rows(project_ids=[target.project_id for target in targets], clusters=[cluster])

    parent_usable: dict[str, bool] = {}
    with transaction.atomic():
        slurm_associations_lock(cluster_id=cluster.pk)
        for target in targets:
            if target.parent_account not in parent_usable:
                parent_findings, usable = _parent_in_line(client=client, cluster=cluster, target=target, view=view)
                findings.extend(parent_findings)
                parent_usable[target.parent_account] = usable

    in_line = []
    for target in targets:
        if not _project_drift(cluster=cluster, target=target, view=view):
            in_line.append(target)
            continue
        findings.extend(
            _reconcile_project(
                cluster=cluster,
                client=client,
                target=target,
                view=view,
                snapshot_at=snapshot_at,
                parent_usable=parent_usable[target.parent_account],
            )
        )
    _record_in_line(cluster=cluster, targets=in_line, snapshot_at=snapshot_at)
    findings.extend(
        _account_limits.drift(cluster=cluster, client=client, targets=targets, own=view.own, snapshot_at=snapshot_at)
    )
    findings.extend(_unknown_accounts(cluster=cluster, view=view))
    return len(targets)


def _reconcile_project(
    *,
    cluster: Cluster,
    client: SlurmClient,
    target: ProjectSlurmTarget,
    view: _SlurmView,
    snapshot_at: datetime,
    parent_usable: bool,
) -> list[Finding]:
    with transaction.atomic():
        # A sync holding the row is bringing the project in line right now; one that finished after the
        # associations were read has done so already. Either way the snapshot is stale for this project.
        if not slurm_associations_lock(cluster_id=cluster.pk, wait=False):
            return []
        row = (
            ProjectSlurmAccount.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
            .filter(project_id=target.project_id, cluster=cluster)
            .first()
        )
        if row is None or (row.synced_at is not None and row.synced_at > snapshot_at):
            return []
        # Memberships may have changed since the run started; act on what holds now, under the lock.
        current = project_slurm_targets(cluster=cluster, project_ids=[target.project_id])
        if not current:
            return []
        findings = _project_in_line(
            client=client, cluster=cluster, target=current[0], view=view, parent_usable=parent_usable
        )
        _record_outcome(row=row, cluster=cluster, target=current[0], findings=findings)
    return findings


def _record_in_line(*, cluster: Cluster, targets: list[ProjectSlurmTarget], snapshot_at: datetime) -> None:
    """Mark the projects found in line as ready and confirmed now, keeping notes on members with no username."""
    now = timezone.now()
    # Rows synced after the snapshot hold a newer outcome than this run's.
    rows = ProjectSlurmAccount.objects.filter(cluster=cluster).exclude(synced_at__gt=snapshot_at)
    rows.filter(project_id__in=[target.project_id for target in targets if not target.members_without_username]).update(
        state=ProjectSlurmAccount.State.READY, last_error="", synced_at=now
    )
    for target in targets:
        if target.members_without_username:
            rows.filter(project_id=target.project_id).update(
                state=ProjectSlurmAccount.State.READY,
                last_error="\n".join(_username_notes(cluster=cluster, target=target)),
                synced_at=now,
            )


def _unknown_accounts(*, cluster: Cluster, view: _SlurmView) -> list[Finding]:
    """Accounts inside the portal's subtrees (under a tenant's parent or a project's account) that no project uses."""
    tenant_parents = tenant_parent_account_names()
    known = project_account_names()
    findings = []
    for account, own in sorted(view.own.items()):
        parent = own.parent_account
        if account in known or (parent not in tenant_parents and parent not in known):
            continue
        where = "tenant parent account" if parent in tenant_parents else "project account"
        detail = (
            f"{account} is under {where} {parent} on cluster {cluster.name}, but no portal project uses it. "
            "Left in place: the portal deletes no account it did not create; a Slurm admin removes it "
            f"(sacctmgr delete account {account}) if nobody needs it."
        )
        findings.append(Finding(SlurmDriftKind.UNKNOWN_ACCOUNT, account=account, detail=detail))
    return findings
