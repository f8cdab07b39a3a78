"""Row locks take only the row they guard: a lock on a joined cluster, project or tenant row would block every
insert that references it (a job, a ledger row, a node) and deadlock with a worker doing the same thing."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from clusters.accounts import _ASSOCIATIONS_LOCK_NAMESPACE, project_slurm_sync, slurm_associations_lock
from clusters.models import Cluster
from clusters.slurm import SlurmUnavailable
from jobs import job_sync
from jobs.models import JobState
from tests.factories import make_job, make_project, make_tenant

APPS = ("portal", "tenants", "clusters", "quotas", "jobs", "billing", "frontend")
ROOT = Path(__file__).resolve().parents[2]


def _select_for_update_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "select_for_update"
                ):
                    calls.append((str(path.relative_to(ROOT)), node.lineno, node))
    return calls


def test_every_row_lock_names_the_rows_it_locks() -> None:
    """`select_for_update()` without `of=` locks every row of every joined table (a `select_related`, or a
    model's ordering across a relation, joins them) in the strongest mode: name the tables, ("self",) as a rule."""
    calls = _select_for_update_calls()
    assert len(calls) > 20  # the walk found the code
    unnamed = [f"{path}:{line}" for path, line, call in calls if "of" not in {k.arg for k in call.keywords}]
    assert unnamed == []


_ROW_LOCK = re.compile(r"\bFOR (?:NO KEY )?(?:UPDATE|SHARE)\b(?! NOWAIT\b)")


def test_every_hand_written_row_lock_names_the_rows_it_locks() -> None:
    """The same rule for the statements written by hand (portal/db.py's `RelatedRows` join their tables):
    `FOR ... OF <alias>` in a statement that joins, or that is built from parts (an f-string) that may."""
    unnamed, found = [], 0
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.JoinedStr):
                    text = "".join(
                        str(part.value) if isinstance(part, ast.Constant) else " JOIN " for part in node.values
                    )
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                else:
                    continue
                if _ROW_LOCK.search(text) and " JOIN " in text:
                    found += 1
                    if not re.search(_ROW_LOCK.pattern + r" OF \w", text):
                        unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found >= 4  # the walk found the worker's claims and record
    assert unnamed == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_claiming_and_recording_jobs_locks_their_rows_only() -> None:
    job = make_job(state=JobState.QUEUED)
    now = timezone.now()

    with transaction.atomic():
        own, _ = job_sync._lock_own(job_id=job.pk, now=now, due_only=False)
        job_sync._lock_due(cluster_id=job.cluster_id, now=now, limit=5, exclude=None)
        job_sync._RECORDED.fetch(job_sync._LOCK_RECORDED, [[job.pk]])
        joined = [
            ("tenants_project", job.project_id),
            ("tenants_tenant", job.project.tenant_id),
            ("clusters_cluster", job.cluster_id),
            ("auth_user", job.user_id),
        ]
        free = {table: _unlocked(table, pk) for table, pk in joined}
        with _other_connection(autocommit=True) as other, pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR NO KEY UPDATE NOWAIT", [job.pk])

    assert own is not None
    assert free == dict.fromkeys(free, True)


def _other_connection(*, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A second connection to the test database, beside Django's."""
    database = connection.settings_dict
    return psycopg.connect(
        host=database["HOST"],
        port=database["PORT"],
        user=database["USER"],
        dbname=database["NAME"],
        autocommit=autocommit,
    )


def _unlocked(table: str, pk: int | None) -> bool:
    """Whether another connection can lock table's row pk in the strongest mode, so no transaction holds it for
    long: it waits up to a few seconds, as a lock taken for a moment by something else (the test's rows are
    committed, and a live worker of another test may sync that cluster) must not count, and the test's own
    transaction holds its locks for far longer."""
    return _lockable(table, pk, "FOR UPDATE", wait_seconds=3)


def _key_share_free(table: str, pk: int) -> bool:
    """Whether another connection could insert a row referencing table's row pk now (its foreign-key check)."""
    return _lockable(table, pk, "FOR KEY SHARE NOWAIT")


def _lockable(table: str, pk: int | None, lock: str, *, wait_seconds: int = 0) -> bool:
    with _other_connection(autocommit=True) as other:
        if wait_seconds:
            other.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{wait_seconds}s")))
        statement = sql.SQL("SELECT 1 FROM {} WHERE id = %s {}").format(sql.Identifier(table), sql.SQL(lock))
        try:
            other.execute(statement, [pk])
        except psycopg.errors.LockNotAvailable:
            return False
    return True


@pytest.mark.django_db(transaction=True)
def test_a_project_sync_holding_its_row_lock_does_not_block_inserts_on_the_cluster_or_project(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadlock CI met: the sync's lock on its status row also locked the cluster row (the row's ordering
    joins it), so a concurrent registration inserting a node of that cluster waited on it, and it on them."""
    cluster = Cluster.objects.create(
        name="local",
        slurmrestd_url=settings.LOCAL_CLUSTER_URL,
        jwt_key_file=settings.LOCAL_CLUSTER_KEY_FILE,
        log_root=settings.LOCAL_CLUSTER_LOG_ROOT,
    )
    project = make_project(make_tenant())
    probes: list[tuple[bool, bool]] = []

    class ProbingClient:
        """Looks at the locks while the sync holds its own, then answers as an unreachable slurmrestd would."""

        def associations(self, **_: Any) -> None:
            probes.append(
                (_key_share_free("clusters_cluster", cluster.pk), _key_share_free("tenants_project", project.pk))
            )
            raise SlurmUnavailable("slurmrestd is being probed")

    monkeypatch.setattr("clusters.accounts.slurm_client_for", lambda _cluster: ProbingClient())
    with pytest.raises(SlurmUnavailable):
        project_slurm_sync(project_id=project.pk)

    assert probes == [(True, True)]


@pytest.mark.django_db(transaction=True)
def test_one_writer_of_a_clusters_associations_at_a_time() -> None:
    """What the cluster row's lock did by accident before, on purpose: association changes of one cluster never
    overlap (22.05's account moves that raced each other broke slurmdbd's association tree)."""
    with transaction.atomic():
        assert slurm_associations_lock(cluster_id=7) is True
        with _other_connection() as other:
            lock = "SELECT pg_try_advisory_xact_lock(%s, %s)"
            held = other.execute(lock, [_ASSOCIATIONS_LOCK_NAMESPACE, 7]).fetchone()
            free = other.execute(lock, [_ASSOCIATIONS_LOCK_NAMESPACE, 8]).fetchone()
    assert (held, free) == ((False,), (True,))
    with transaction.atomic():
        assert slurm_associations_lock(cluster_id=7, wait=False) is True  # released with the transaction
