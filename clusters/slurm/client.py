"""A typed, synchronous slurmrestd client: explicit timeouts, bounded pools, typed errors, versioned codecs."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from clusters.slurm.codecs import SUPPORTED_VERSIONS_NEWEST_FIRST, codec_for
from clusters.slurm.codecs.base import Codec, Json, epoch
from clusters.slurm.errors import (
    SlurmAuthError,
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
    SlurmServerError,
    SlurmTimeout,
    SlurmUnavailable,
)
from clusters.slurm.tokens import TokenMinter
from clusters.slurm.types import (
    AccountInfo,
    AccountingRecord,
    AssociationInfo,
    JobsListing,
    JobSubmission,
    NodeInfo,
    PartitionInfo,
    PingResult,
    SlurmJob,
    SlurmMessage,
    SubmitResult,
)

logger = logging.getLogger(__name__)

# Slurm error numbers (slurm_errno.h) that say "try again later" rather than "no".
_AUTH_ERRORS = {1007, 2002, 6000}  # protocol authentication, access denied, plugin auth
_NOT_FOUND_ERRORS = {2017}  # invalid job id
_NOTHING_FOUND_ERROR = 9003  # slurmdbd: a query matched nothing
_ALREADY_DONE = 2021  # ESLURM_ALREADY_DONE: "Job/step already completing or completed"
# The warning of a data_parser GET /jobs/?update_time= when nothing changed: an answer, not a problem.
_NO_JOB_CHANGES = "No job changes since update_time"
_HELD_WARNINGS = frozenset({"Job is in held state"})
# What v0.0.40+ say, as a warning, of a read that matched nothing: an empty list, not a problem.
_EMPTY_RESULT_WARNINGS = frozenset({"found nothing", "Zero jobs to dump"})
# "/slurm/v0.0.42/jobs/" and "/slurmdb/v0.0.38/accounts/" in a daemon's OpenAPI description.
_VERSIONED_PATH = re.compile(r"^/(?P<plugin>slurm|slurmdb)/v(?P<version>\d+\.\d+\.\d+)/")


# "/slurm/v0.0.38/job/123" -> "slurm/job": the endpoint without version or ids, a short fixed set for metrics.
_ENDPOINT = re.compile(r"^/(?P<plugin>slurm|slurmdb)/v[\d.]+/(?P<resource>[a-z_]+)")


def endpoint_of(path: str) -> str:
    match = _ENDPOINT.match(path)
    if match:
        return f"{match.group('plugin')}/{match.group('resource')}"
    return "openapi" if path.startswith("/openapi") else "other"


class SlurmCallObserver(Protocol):
    """Told of every exchange with slurmrestd (the portal's metrics: portal.metrics.SlurmrestdMetrics)."""

    def request_done(self, *, api_version: str, method: str, endpoint: str, seconds: float) -> None: ...

    def request_failed(self, *, api_version: str, kind: str) -> None: ...


def _is_retryable_number(number: int) -> bool:
    # 1000-1099: communication with slurmctld, except 1007 (authentication);
    # 1800-1899: slurmctld communication; 5000-5099: socket timeouts; 7000-7099: slurmdbd connection.
    if number == 1007:
        return False
    return 1000 <= number < 1100 or 1800 <= number < 1900 or 5000 <= number < 5100 or 7000 <= number < 7100


class SlurmClient:
    """One client per cluster. Cluster-wide reads and account management use `admin_user`'s token;
    job submission and cancellation use the token of the job's own POSIX user."""

    def __init__(
        self,
        *,
        base_url: str,
        key_file: str | Path,
        admin_user: str = "root",
        api_version: str | None = None,
        timeout_seconds: float = 10.0,
        max_connections: int = 10,
        token_lifespan_seconds: int = 300,
        transport: httpx.BaseTransport | None = None,
        observer: SlurmCallObserver | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.admin_user = admin_user
        self.tokens = TokenMinter(key_file=key_file, lifespan_seconds=token_lifespan_seconds)
        self.timeout_seconds = timeout_seconds
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_seconds, connect=min(timeout_seconds, 3.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            headers={"Accept": "application/json"},
        )
        self._codec: Codec | None = codec_for(api_version) if api_version else None
        self.observer = observer

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SlurmClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Version ----------------------------------------------------------------------------------

    @property
    def codec(self) -> Codec:
        if self._codec is None:
            self._codec = codec_for(self.detect_version())
        return self._codec

    @property
    def api_version(self) -> str:
        return self.codec.version

    def served_versions(self) -> tuple[str, ...]:
        """The API versions the daemon serves for both slurmctld and slurmdbd, newest first, from its /openapi/v3."""
        # Read without a codec: choosing one is what this is for.
        response = self._send("GET", "/openapi/v3", user=self.admin_user)
        try:
            body = response.json() if response.status_code == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise SlurmRejected(
                f"slurmrestd at {self.base_url} did not describe its API (GET /openapi/v3 answered "
                f"HTTP {response.status_code})",
                status_code=response.status_code,
            )
        paths = body.get("paths")
        found: dict[str, set[str]] = {}
        for path in paths if isinstance(paths, dict) else ():
            match = _VERSIONED_PATH.match(path)
            if match:
                found.setdefault(match.group("version"), set()).add(match.group("plugin"))
        both = [version for version, plugins in found.items() if plugins >= {"slurm", "slurmdb"}]
        return tuple(sorted(both, key=lambda version: tuple(int(part) for part in version.split(".")), reverse=True))

    def detect_version(self) -> str:
        """The newest API version both the daemon and the portal know.

        Read from the daemon's own OpenAPI description; a daemon that does not answer it is probed with
        `/slurm/vX/ping` newest first.
        """
        try:
            served: tuple[str, ...] | None = self.served_versions()
        except (SlurmNotFound, SlurmRejected):
            served = None
        if served is not None:
            for version in SUPPORTED_VERSIONS_NEWEST_FIRST:
                if version in served:
                    return version
            raise SlurmNotFound(
                f"{self.base_url} serves slurmrestd API versions {', '.join(served) or 'none'}, none of which the "
                f"portal knows ({', '.join(SUPPORTED_VERSIONS_NEWEST_FIRST)}); start slurmrestd with one of them "
                "(its -s option) or upgrade the portal"
            )
        for version in SUPPORTED_VERSIONS_NEWEST_FIRST:
            try:
                response = self._send("GET", f"/slurm/v{version}/ping/", user=self.admin_user)
            except SlurmNotFound:
                continue
            if response.status_code == 200:
                return version
        supported = ", ".join(SUPPORTED_VERSIONS_NEWEST_FIRST)
        raise SlurmNotFound(f"{self.base_url} serves none of the supported slurmrestd API versions ({supported})")

    def ping(self) -> PingResult:
        started = time.perf_counter()
        body = self._call("GET", f"{self.codec.slurm_prefix}/ping/", user=self.admin_user)
        latency = time.perf_counter() - started
        responding, release, cluster = self.codec.decode_ping(body)
        return PingResult(
            api_version=self.codec.version,
            slurm_release=release,
            cluster_name=cluster,
            responding=responding,
            latency_seconds=latency,
        )

    # Jobs -------------------------------------------------------------------------------------

    def submit_job(self, *, user: str, submission: JobSubmission) -> SubmitResult:
        """Submit as `user`. Logs one line, with what the caller bound to the logging context (a job's id, its
        request's id, the cluster's name: jobs/job_sync.py) and the API version, HTTP status, duration and Slurm
        job id (README, "Logs and tracing a job")."""
        payload = self.codec.encode_submit(submission)
        fields: dict[str, object] = {"api_version": self.codec.version, "slurm_user": user}
        started = time.perf_counter()
        try:
            response = self._send("POST", f"{self.codec.slurm_prefix}/job/submit", user=user, payload=payload)
            fields["status"] = response.status_code
            body = self._checked_body(
                response,
                success_if_job_id=True,
                # v0.0.40+ report a held job's state as warnings: asked for, so not worth a log line each.
                expected_warnings=_HELD_WARNINGS if submission.hold else frozenset(),
            )
            result = self.codec.decode_submit(body)
        except SlurmError as exc:
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
            fields.setdefault("status", exc.status_code)
            logger.warning("slurmrestd submit failed: %s", exc, extra=fields)
            raise
        fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
        fields["slurm_job_id"] = result.job_id
        logger.info("slurmrestd submit", extra=fields)
        return result

    def get_job(self, *, job_id: int, user: str | None = None) -> SlurmJob:
        body = self._call("GET", f"{self.codec.slurm_prefix}/job/{int(job_id)}", user=user or self.admin_user)
        jobs = self.codec.decode_jobs(body).jobs
        if not jobs:
            raise SlurmNotFound(f"Slurm has no job {job_id}")
        return jobs[0]

    def list_jobs(self, *, updated_since: datetime | None = None) -> JobsListing | None:
        """Every job slurmctld knows, or None when nothing changed since `updated_since`.

        22.05 says "nothing changed" with HTTP 304. From v0.0.40 on it is HTTP 200 with no jobs, `last_update` 0
        and the warning "No job changes since update_time[...]" (measured on 24.11 and 26.05): the same answer.
        """
        params = {"update_time": str(epoch(updated_since))} if updated_since else None
        response = self._send("GET", f"{self.codec.slurm_prefix}/jobs/", user=self.admin_user, params=params)
        if response.status_code == 304:
            return None
        body = self._checked_body(response, expected_warnings=frozenset({_NO_JOB_CHANGES}))
        listing = self.codec.decode_jobs(body)
        if updated_since and not listing.jobs and listing.last_update is None:
            return None
        return listing

    def cancel_job(self, *, user: str, job_id: int, array_task: int | None = None) -> None:
        """Cancel the job; one that is already ending (completing, completed) is left as it is, without an error.

        `array_task`: cancel only this task of the array `job_id` (`scancel 12_7`; every version takes the
        `<array job id>_<task>` form in the path, started or still pending)."""
        target = f"{int(job_id)}_{int(array_task)}" if array_task is not None else str(int(job_id))
        try:
            body = self._call("DELETE", f"{self.codec.slurm_prefix}/job/{target}", user=user)
        except SlurmRejected as exc:
            if any(message.error_number == _ALREADY_DONE for message in exc.messages):
                return
            raise
        # From v0.0.40 on a refused cancel is HTTP 200 with empty errors[]: the refusal is in the per-job status.
        refusals = tuple(
            message for message in self.codec.decode_signal_failures(body) if message.error_number != _ALREADY_DONE
        )
        if refusals:
            raise self._error_from(200, refusals)

    def accounting_jobs(
        self,
        *,
        account: str | None = None,
        users: Iterable[str] = (),
        start_time: datetime | None = None,
        end_time: datetime | None = None,
    ) -> list[AccountingRecord]:
        params: dict[str, str] = {}
        if account:
            params["account"] = account
        if users:
            params["users"] = ",".join(users)
        now = datetime.now(UTC)
        if start_time:
            params["start_time"] = self.codec.encode_accounting_time(start_time, now=now)
        if end_time:
            params["end_time"] = self.codec.encode_accounting_time(end_time, now=now)
        try:
            body = self._call("GET", f"{self.codec.slurmdb_prefix}/jobs/", user=self.admin_user, params=params)
        except SlurmRejected as exc:
            # 22.05 answers a query that matches no job with an error (9003 "Nothing found"): for a list,
            # that is the empty list.
            if any(message.error_number == _NOTHING_FOUND_ERROR for message in exc.messages):
                return []
            raise
        return self.codec.decode_accounting_jobs(body)

    def accounting_job_records(self, *, job_id: int) -> list[AccountingRecord]:
        """Every accounting record with this id, oldest submission first.

        One job has a record per attempt: when Slurm requeues a running job (its node failed, it was preempted),
        the run so far is recorded as ended and the requeued job gets a new record under the same id, with a
        new submit time. Records of other jobs can share the id too, after Slurm's state was reset.
        """
        body = self._call("GET", f"{self.codec.slurmdb_prefix}/job/{int(job_id)}", user=self.admin_user)
        records = self.codec.decode_accounting_jobs(body)
        if not records:
            raise SlurmNotFound(f"Slurm's accounting has no job {job_id}")
        return sorted(records, key=lambda record: record.submit_time or datetime.min.replace(tzinfo=UTC))

    def accounting_job(self, *, job_id: int) -> AccountingRecord:
        """The newest record with this id: the job's current (or last) attempt."""
        return self.accounting_job_records(job_id=job_id)[-1]

    # Cluster ----------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        return self.codec.decode_nodes(self._call("GET", f"{self.codec.slurm_prefix}/nodes/", user=self.admin_user))

    def partitions(self) -> list[PartitionInfo]:
        body = self._call("GET", f"{self.codec.slurm_prefix}/partitions/", user=self.admin_user)
        return self.codec.decode_partitions(body)

    # Accounts, associations, limits ------------------------------------------------------------

    def accounts(self) -> list[AccountInfo]:
        body = self._call("GET", f"{self.codec.slurmdb_prefix}/accounts/", user=self.admin_user)
        return self.codec.decode_accounts(body)

    def create_account(
        self,
        *,
        name: str,
        cluster: str,
        description: str,
        organization: str,
        parent_account: str = "root",
        gpu_minutes_limit: int | None = None,
    ) -> None:
        """Create the account and its association on `cluster` under `parent_account`, then verify it.

        v0.0.38 creates only the account record on POST /accounts; the association that lets users
        join it on a cluster (and that carries its limits) is a second request.
        """
        if gpu_minutes_limit is None and self.codec.account_limit_needs_parent_move:
            # Measured on 22.05.8: moving an existing account that has a limit without sending the limit
            # crashes slurmrestd, and a crash in the middle of a move can leave slurmdbd's association tree
            # broken. Creating an existing account moves it: carry the limit it has.
            gpu_minutes_limit = self._existing_gpu_minutes_limit(account=name, cluster=cluster)
        account = AccountInfo(name=name, description=description, organization=organization)
        creation = self.codec.encode_account_creation(
            account, cluster=cluster, parent_account=parent_account, gpu_minutes_limit=gpu_minutes_limit
        )
        if creation is None:
            payload = self.codec.encode_accounts([account], parent_account=parent_account)
            self._call("POST", f"{self.codec.slurmdb_prefix}/accounts/", user=self.admin_user, payload=payload)
        else:
            path, payload = creation
            self._call("POST", f"{self.codec.slurmdb_prefix}{path}", user=self.admin_user, payload=payload)
        # Written in full either way: it moves an existing account to `parent_account` and sets its limit.
        association = AssociationInfo(
            account=name,
            cluster=cluster,
            user="",
            parent_account=parent_account,
            gpu_minutes_limit=gpu_minutes_limit,
        )
        self._write_associations([association])
        created = self._account_association(account=name, cluster=cluster)
        if created.gpu_minutes_limit != gpu_minutes_limit:
            raise SlurmRejected(
                f"Slurm created account {name!r} but reads back GrpTRESMins=gres/gpu={created.gpu_minutes_limit} "
                f"instead of {gpu_minutes_limit}"
            )

    def _existing_gpu_minutes_limit(self, *, account: str, cluster: str) -> int | None:
        try:
            return self.account_gpu_minutes_limit(account=account, cluster=cluster)
        except SlurmNotFound:
            return None
        except SlurmError as exc:  # 22.05 answers 500 with 9003 when the account has no association yet
            if any(message.error_number == _NOTHING_FOUND_ERROR for message in exc.messages):
                return None
            raise

    def delete_account(self, *, name: str) -> None:
        self._call("DELETE", f"{self.codec.slurmdb_prefix}/account/{name}", user=self.admin_user)

    def associations(
        self, *, account: str | None = None, user: str | None = None, cluster: str | None = None
    ) -> list[AssociationInfo]:
        params = {key: value for key, value in {"account": account, "user": user, "cluster": cluster}.items() if value}
        body = self._call("GET", f"{self.codec.slurmdb_prefix}/associations/", user=self.admin_user, params=params)
        return self.codec.decode_associations(body)

    def add_user_association(self, *, account: str, user: str, cluster: str) -> None:
        association = AssociationInfo(
            account=account, cluster=cluster, user=user, parent_account="", gpu_minutes_limit=None
        )
        self._write_associations([association])

    def remove_user_association(self, *, account: str, user: str, cluster: str) -> None:
        params = {"account": account, "user": user, "cluster": cluster}
        self._call("DELETE", f"{self.codec.slurmdb_prefix}/association/", user=self.admin_user, params=params)

    def account_gpu_minutes_limit(self, *, account: str, cluster: str) -> int | None:
        """The account's GrpTRESMins for gres/gpu, read from its own (user-less) association."""
        return self._account_association(account=account, cluster=cluster).gpu_minutes_limit

    def _account_association(self, *, account: str, cluster: str) -> AssociationInfo:
        for association in self.associations(account=account, cluster=cluster):
            if association.account == account and not association.user:
                return association
        raise SlurmNotFound(f"Slurm has no account {account!r} on cluster {cluster!r}")

    def set_account_gpu_minutes_limit(self, *, account: str, cluster: str, minutes: int | None) -> int | None:
        """Write the limit (None clears it), then read it back: slurmrestd can report success and change nothing."""
        current = self._account_association(account=account, cluster=cluster)
        # -1 clears a limit, as with `sacctmgr modify account X set GrpTRESMins=gres/gpu=-1`.
        limit = minutes if minutes is not None else -1
        if self.codec.account_limit_needs_parent_move:
            self._set_limit_by_moving(current=current, limit=limit)
        else:
            self._write_associations([replace(current, gpu_minutes_limit=limit)])
        applied = self.account_gpu_minutes_limit(account=account, cluster=cluster)
        if applied != minutes:
            raise SlurmRejected(
                f"Slurm accepted GrpTRESMins=gres/gpu={minutes} for account {account!r} "
                f"but reads back {applied}; the limit was not applied"
            )
        return applied

    def _set_limit_by_moving(self, *, current: AssociationInfo, limit: int) -> None:
        """Apply a limit on 22.05 by moving the account to root and back to its parent, both moves carrying it."""
        parent = current.parent_account
        if limit < 0:
            # Measured: the move clears the limit in slurmdbd, but slurmctld keeps enforcing the old one.
            raise SlurmRejected(
                f"clearing account {current.account!r}'s GPU-minute limit is not possible through slurmrestd v0.0.38 "
                "(Slurm 22.05): slurmctld keeps the old limit; set a new limit instead"
            )
        if parent in {"", "root"}:
            raise SlurmRejected(
                f"account {current.account!r} sits directly under root: slurmrestd v0.0.38 (Slurm 22.05) can change "
                "an account's limits only for accounts under another parent account"
            )
        self._write_associations([replace(current, parent_account="root", gpu_minutes_limit=limit)])
        try:
            self._write_associations([replace(current, parent_account=parent, gpu_minutes_limit=limit)])
        except SlurmError as exc:
            raise type(exc)(
                f"account {current.account!r} was moved under root to change its limit and could not be moved "
                f"back under {parent!r}: {exc}",
                messages=exc.messages,
                status_code=exc.status_code,
            ) from exc
        moved_back = self._account_association(account=current.account, cluster=current.cluster)
        if moved_back.parent_account != parent:
            raise SlurmRejected(
                f"account {current.account!r} reads back under {moved_back.parent_account!r}, not {parent!r}, "
                "after its limit was changed"
            )

    def _write_associations(self, associations: list[AssociationInfo]) -> None:
        self._call(
            "POST",
            f"{self.codec.slurmdb_prefix}/associations/",
            user=self.admin_user,
            payload=self.codec.encode_associations(associations),
            tolerated_errors=self.codec.tolerated_association_errors,
        )

    # Transport --------------------------------------------------------------------------------

    def _headers(self, user: str) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": self.tokens.token_for(user)}

    def _send(
        self,
        method: str,
        path: str,
        *,
        user: str,
        params: Mapping[str, str] | None = None,
        payload: Json | None = None,
    ) -> httpx.Response:
        """One HTTP exchange; transport failures become retryable errors, HTTP 401/404 typed ones."""
        started = time.perf_counter()
        try:
            return self._exchange(method, path, user=user, params=params, payload=payload)
        except SlurmError as exc:
            self._observe_failure(exc)
            raise
        finally:
            if self.observer is not None:
                self.observer.request_done(
                    api_version=self._observed_version,
                    method=method,
                    endpoint=endpoint_of(path),
                    seconds=time.perf_counter() - started,
                )

    @property
    def _observed_version(self) -> str:
        return self._codec.version if self._codec is not None else "none"  # "none": while negotiating it

    def _observe_failure(self, exc: SlurmError) -> None:
        if self.observer is not None:
            self.observer.request_failed(api_version=self._observed_version, kind=exc.kind)

    def _exchange(
        self,
        method: str,
        path: str,
        *,
        user: str,
        params: Mapping[str, str] | None,
        payload: Json | None,
    ) -> httpx.Response:
        try:
            try:
                response = self._request(method, path, user=user, params=params, payload=payload)
            except (httpx.ReadError, httpx.RemoteProtocolError):
                if method != "GET":
                    raise
                # A kept-alive connection slurmrestd had closed meanwhile (reset, or closed without an answer): a
                # read is asked again once, on a new connection. A write is not: it may have been carried out.
                response = self._request(method, path, user=user, params=params, payload=payload)
        except httpx.TimeoutException as exc:
            raise SlurmTimeout(
                f"slurmrestd at {self.base_url} did not answer {method} {path} within {self.timeout_seconds:g}s"
            ) from exc
        except httpx.TransportError as exc:
            raise SlurmUnavailable(f"slurmrestd at {self.base_url} is unreachable: {exc}") from exc
        if response.status_code == 401:
            raise SlurmAuthError(
                f"slurmrestd refused the token for user {user!r}: {response.text.strip() or 'authentication failure'}",
                status_code=401,
            )
        if response.status_code == 404 and not self._is_json(response):
            raise SlurmNotFound(f"slurmrestd has no {path}: {response.text.strip()[:200]}", status_code=404)
        return response

    def _request(
        self, method: str, path: str, *, user: str, params: Mapping[str, str] | None, payload: Json | None
    ) -> httpx.Response:
        return self._http.request(
            method,
            path,
            params=params,
            content=json.dumps(payload) if payload is not None else None,
            headers={**self._headers(user), **({"Content-Type": "application/json"} if payload else {})},
        )

    @staticmethod
    def _is_json(response: httpx.Response) -> bool:
        content_type: str = response.headers.get("content-type", "")
        return content_type.startswith("application/json")

    def _call(
        self,
        method: str,
        path: str,
        *,
        user: str,
        params: Mapping[str, str] | None = None,
        payload: Json | None = None,
        success_if_job_id: bool = False,
        tolerated_errors: frozenset[str] = frozenset(),
        expected_warnings: frozenset[str] = frozenset(),
    ) -> Json:
        response = self._send(method, path, user=user, params=params, payload=payload)
        return self._checked_body(
            response,
            success_if_job_id=success_if_job_id,
            tolerated_errors=tolerated_errors,
            expected_warnings=expected_warnings,
        )

    def _checked_body(
        self,
        response: httpx.Response,
        *,
        success_if_job_id: bool = False,
        tolerated_errors: frozenset[str] = frozenset(),
        expected_warnings: frozenset[str] = frozenset(),
    ) -> Json:
        """The decoded reply, or a typed error built from Slurm's own `errors[]`."""
        try:
            return self._read_body(
                response,
                success_if_job_id=success_if_job_id,
                tolerated_errors=tolerated_errors,
                expected_warnings=expected_warnings,
            )
        except SlurmError as exc:
            self._observe_failure(exc)
            raise

    def _read_body(
        self,
        response: httpx.Response,
        *,
        success_if_job_id: bool,
        tolerated_errors: frozenset[str],
        expected_warnings: frozenset[str],
    ) -> Json:
        try:
            body: Any = response.json() if response.content else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            if response.status_code >= 500:
                raise SlurmServerError(
                    f"slurmrestd answered HTTP {response.status_code}: {response.text.strip()[:200]}",
                    status_code=response.status_code,
                )
            raise SlurmRejected(
                f"slurmrestd answered HTTP {response.status_code} with a body that is not JSON: "
                f"{response.text.strip()[:200]}",
                status_code=response.status_code,
            )
        # Unknown or mistyped fields are dropped with only a warning in v0.0.40+ (e.g. a GPU request):
        # never let one pass silently. Submissions also return theirs in SubmitResult.warnings.
        if response.request.method == "GET":
            expected_warnings = expected_warnings | _EMPTY_RESULT_WARNINGS
        for warning in self.codec.decode_warnings(body):
            if any(text in warning.description for text in expected_warnings):
                continue
            logger.warning("slurmrestd %s %s: %s", response.request.method, response.request.url.path, warning)
        errors = tuple(
            message
            for message in self.codec.decode_errors(body)
            if not any(text in message.description for text in tolerated_errors)
        )
        # A submission with a job id succeeded even if errors[] says e.g. "Job is in held state".
        if success_if_job_id and body.get("job_id"):
            return body
        if not errors and response.status_code < 400:
            return body
        raise self._error_from(response.status_code, errors)

    def _error_from(self, status_code: int, errors: tuple[SlurmMessage, ...]) -> SlurmError:
        text = "; ".join(str(message) for message in errors) or f"slurmrestd answered HTTP {status_code}"
        numbers = {message.error_number for message in errors if message.error_number}
        if any(self.codec.is_auth_failure(message) for message in errors):
            # 22.05 answers alike when slurmctld is down (measured in the slurmctld drill: HTTP 500 after ~9 s)
            # and when it refuses the token: name both, or an outage reads as a key problem.
            return SlurmAuthError(
                "slurmctld did not answer, or refused the token: slurmrestd reports both the same way. Check that "
                f"slurmctld is running, then the cluster's JWT key and the clocks: {text}",
                messages=errors,
                status_code=status_code,
            )
        if numbers & _AUTH_ERRORS:
            return SlurmAuthError(text, messages=errors, status_code=status_code)
        if numbers & _NOT_FOUND_ERRORS or status_code == 404:
            return SlurmNotFound(text, messages=errors, status_code=status_code)
        if any(_is_retryable_number(number) for number in numbers):
            return SlurmServerError(text, messages=errors, status_code=status_code)
        if numbers:
            return SlurmRejected(text, messages=errors, status_code=status_code)
        if status_code >= 500:
            return SlurmServerError(text, messages=errors, status_code=status_code)
        return SlurmRejected(text, messages=errors, status_code=status_code)
