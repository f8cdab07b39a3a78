"""Codec for slurmrestd API v0.0.38 (Slurm 22.05, the version Debian 12 ships and the local cluster runs)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from clusters.slurm.codecs.base import (
    Codec,
    Json,
    accounting_array_fields,
    accounting_nodes,
    expand_hostlist,
    gpu_indices_by_node,
    gpu_usage_in_steps,
    gpus_in,
    gpus_in_tres_list,
    job_array_fields,
    messages_from,
    plain_number,
    shell_exit_code,
    switch_from_features,
    timestamp,
    untyped_gpu_count,
)
from clusters.slurm.types import (
    AccountInfo,
    AccountingRecord,
    AssociationInfo,
    JobsListing,
    JobState,
    JobSubmission,
    NodeInfo,
    NodeState,
    PartitionInfo,
    SlurmJob,
    SlurmMessage,
    SubmitResult,
)

# v0.0.38 refuses a batch job whose environment is empty ("Environment is missing in job").
_MINIMAL_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


class V0038Codec(Codec):
    version = "0.0.38"
    # An account-level limit sent without `user` is applied, yet the reply carries this error
    # (SLURM-NOTES.md); the client reads the limit back, so tolerating it is safe.
    tolerated_association_errors = frozenset({"Missing required field 'user'"})
    # 22.05's parser fills a missing parent_account with "root", so slurmdbd reads every account-level
    # modify as "move to the parent it already has", logs "Nothing to do" and skips the new limits too.
    # A real move does apply them: the client moves the account to root and back (see SLURM-NOTES).
    account_limit_needs_parent_move = True

    def encode_accounting_time(self, moment: datetime, *, now: datetime) -> str:
        # dbv0.0.38 parses these with Slurm's parse_time, which refuses epoch seconds (error 9000) and reads
        # absolute dates in slurmrestd's local time zone; a time relative to "now" means the same everywhere.
        seconds = int((now - moment).total_seconds())
        return f"now-{seconds}" if seconds >= 0 else f"now+{-seconds}"

    def is_auth_failure(self, message: SlurmMessage) -> bool:
        # 22.05 forwards the token to slurmctld, which rejects an expired or foreign one with a bare
        # SLURM_ERROR; slurmrestd then reports -1 "Unspecified error" from the RPC it was making
        # (slurm_load_ctl_conf, slurm_load_jobs, ...). slurmdbd's endpoints say 1007 instead.
        return message.error_number == -1 and (message.source or "").startswith("slurm_")

    def decode_errors(self, body: Json) -> tuple[SlurmMessage, ...]:
        return messages_from(body.get("errors"), text_keys=("error", "description"))

    def decode_warnings(self, body: Json) -> tuple[SlurmMessage, ...]:
        return messages_from(body.get("warnings"), text_keys=("warning", "description", "error"))

    def decode_ping(self, body: Json) -> tuple[bool, str | None, str | None]:
        pings = body.get("pings") or []
        responding = bool(pings) and all(ping.get("ping") == "UP" for ping in pings)
        slurm = (body.get("meta") or {}).get("Slurm") or {}
        version = slurm.get("version") or {}
        release = slurm.get("release") or (
            f"{version.get('major')}.{version.get('minor')}.{version.get('micro')}" if version else None
        )
        return responding, release, None

    # Jobs --------------------------------------------------------------------------------------

    def encode_submit(self, submission: JobSubmission) -> Json:
        job: Json = {
            "name": submission.name,
            "account": submission.account,
            "partition": submission.partition,
            "time_limit": submission.time_limit_minutes,
            "current_working_directory": submission.working_directory,
            "standard_output": submission.standard_output,
            "standard_error": submission.standard_error,
            "environment": dict(submission.environment) or dict(_MINIMAL_ENVIRONMENT),
            # A plain count, against the spec's [min, max] array: measured on 22.05.8, [2, 2] is accepted and
            # runs the job on one node (NumNodes=1), while 2 gives NumNodes=2-2.
            "nodes": submission.nodes,
        }
        if submission.gpus and submission.nodes > 1:
            job["gpus_per_node"] = submission.gpu_spec
        elif submission.gpus:
            job["gpus"] = submission.gpu_spec
        if submission.max_switches == 1 and submission.one_switch_constraint:
            # 22.05's v0.0.38 refuses required_switches and wait_for_switch ("Disabled key"), measured here.
            job["constraints"] = submission.one_switch_constraint
        if submission.comment:
            job["comment"] = submission.comment
        if submission.cpus:
            job["cpus_per_task"] = submission.cpus
        if submission.memory_mb:
            job["memory_per_node"] = submission.memory_mb
        if submission.hold:
            job["hold"] = True
        if submission.array:
            job["array"] = submission.array
        if submission.dependency:
            job["dependency"] = submission.dependency
        return {"script": submission.script, "job": job}

    def decode_submit(self, body: Json) -> SubmitResult:
        return SubmitResult(
            job_id=int(body["job_id"]),
            warnings=self.decode_warnings(body) + self.decode_errors(body),
            user_message=body.get("job_submit_user_msg") or "",
        )

    def decode_jobs(self, body: Json) -> JobsListing:
        jobs = tuple(self._decode_job(raw) for raw in body.get("jobs") or [])
        # v0.0.38 has no top-level last_update; the newest change among the jobs stands in for it.
        return JobsListing(jobs=jobs, last_update=None)

    def _decode_job(self, raw: dict[str, Any]) -> SlurmJob:
        state = JobState.parse(raw.get("job_state"))
        # Allocated GPUs once the job holds nodes; until then the request, which tres_req_str spells the same way.
        gpus, gpu_type = gpus_in(raw.get("tres_alloc_str"))
        if not gpus:
            gpus, gpu_type = gpus_in(raw.get("tres_req_str"))
        return SlurmJob(
            job_id=int(raw["job_id"]),
            name=raw.get("name") or "",
            account=raw.get("account") or "",
            partition=raw.get("partition") or "",
            user_name=raw.get("user_name") or "",
            state=state,
            state_reason=raw.get("state_reason") or "None",
            comment=raw.get("comment") or "",
            submit_time=timestamp(raw.get("submit_time")),
            start_time=timestamp(raw.get("start_time")) if state is not JobState.PENDING else None,
            end_time=timestamp(raw.get("end_time")) if state.is_finished else None,
            time_limit_minutes=plain_number(raw.get("time_limit")),
            gpus=gpus,
            gpu_type=gpu_type,
            nodes=raw.get("nodes") or "",
            # The raw wait status: 768 for `exit 3`, 9 for SIGKILL.
            # A job that never got nodes has slurmctld's 1 here, which would read as signal 1: no result.
            exit_code=shell_exit_code(raw.get("exit_code")) if state.is_finished and raw.get("nodes") else None,
            standard_output=raw.get("standard_output") or "",
            standard_error=raw.get("standard_error") or "",
            restart_count=plain_number(raw.get("restart_cnt")) or 0,
            gpu_indices=gpu_indices_by_node(nodes=raw.get("nodes") or "", gres_detail=raw.get("gres_detail")),
            expected_start_time=timestamp(raw.get("start_time")) if state is JobState.PENDING else None,
            **job_array_fields(raw),
        )

    def decode_accounting_jobs(self, body: Json) -> list[AccountingRecord]:
        return [self._decode_accounting_job(raw) for raw in body.get("jobs") or []]

    def _decode_accounting_job(self, raw: dict[str, Any]) -> AccountingRecord:
        time = raw.get("time") or {}
        state = raw.get("state") or {}
        gpus, gpu_type = gpus_in_tres_list((raw.get("tres") or {}).get("allocated") or [])
        job_state = JobState.parse(state.get("current"))
        comment = raw.get("comment")
        gpu_utilisation, gpu_memory = gpu_usage_in_steps(raw.get("steps") or [])
        return AccountingRecord(
            job_id=int(raw["job_id"]),
            name=raw.get("name") or "",
            account=raw.get("account") or "",
            user_name=raw.get("user") or "",
            partition=raw.get("partition") or "",
            cluster=raw.get("cluster") or "",
            state=job_state,
            comment=(comment.get("job") or "") if isinstance(comment, dict) else (comment or ""),
            submit_time=timestamp(time.get("submission")),
            start_time=timestamp(time.get("start")),
            end_time=timestamp(time.get("end")),
            elapsed_seconds=plain_number(time.get("elapsed")) or 0,
            gpus_allocated=gpus,
            gpu_type=gpu_type,
            exit_code=_accounting_exit_code(raw.get("exit_code"), job_state),
            nodes=accounting_nodes(raw.get("nodes")),
            time_limit_minutes=plain_number(time.get("limit")),
            gpu_utilisation_percent=gpu_utilisation,
            gpu_memory_peak_bytes=gpu_memory,
            **accounting_array_fields(raw),
        )

    # Cluster -----------------------------------------------------------------------------------

    def decode_nodes(self, body: Json) -> list[NodeInfo]:
        nodes = []
        for raw in body.get("nodes") or []:
            flags = [raw.get("state") or "", *(raw.get("state_flags") or [])]
            gpus_total, gpu_type = gpus_in(raw.get("gres"))
            gpus_used, _ = gpus_in(raw.get("gres_used"))
            nodes.append(
                NodeInfo(
                    name=raw.get("name") or "",
                    state=NodeState.from_flags([flag for flag in flags if flag]),
                    state_flags=tuple(flag.upper() for flag in flags if flag),
                    reason=raw.get("reason") or "",
                    partitions=tuple(raw.get("partitions") or ()),
                    cpus=plain_number(raw.get("cpus")) or 0,
                    cpus_allocated=plain_number(raw.get("alloc_cpus")) or 0,
                    real_memory_mb=plain_number(raw.get("real_memory")) or 0,
                    gpu_type=gpu_type,
                    gpus_total=gpus_total,
                    gpus_used=gpus_used,
                    switch=switch_from_features(raw.get("features")),
                )
            )
        return nodes

    def decode_partitions(self, body: Json) -> list[PartitionInfo]:
        partitions = []
        for raw in body.get("partitions") or []:
            flags = {flag.upper() for flag in raw.get("flags") or []}
            partitions.append(
                PartitionInfo(
                    name=raw.get("name") or "",
                    nodes=expand_hostlist(raw.get("nodes")),
                    # The spec says maximum_time_limit; 22.05.8 really sends max_time_limit.
                    max_time_minutes=plain_number(raw.get("max_time_limit", raw.get("maximum_time_limit"))),
                    default_time_minutes=plain_number(raw.get("default_time_limit")),
                    is_default="DEFAULT" in flags,
                    state=(raw.get("state") or "UNKNOWN").upper(),
                )
            )
        return partitions

    # Accounts and associations -----------------------------------------------------------------

    def encode_accounts(self, accounts: Iterable[AccountInfo], *, parent_account: str | None) -> Json:
        encoded = []
        for account in accounts:
            entry: Json = {
                "name": account.name,
                "description": account.description,
                "organization": account.organization,
            }
            if parent_account:
                entry["parent_account"] = parent_account
            encoded.append(entry)
        return {"accounts": encoded}

    def decode_accounts(self, body: Json) -> list[AccountInfo]:
        return [
            AccountInfo(
                name=raw.get("name") or "",
                description=raw.get("description") or "",
                organization=raw.get("organization") or "",
            )
            for raw in body.get("accounts") or []
        ]

    def encode_associations(self, associations: Iterable[AssociationInfo]) -> Json:
        encoded = []
        for association in associations:
            entry: Json = {"account": association.account, "cluster": association.cluster}
            if association.user:
                entry["user"] = association.user
            if association.parent_account:
                entry["parent_account"] = association.parent_account
            if association.gpu_minutes_limit is not None:
                # The spec omits max.tres.group.minutes, but 22.05's parser reads it: it is GrpTRESMins.
                limit = [{"type": "gres", "name": "gpu", "count": association.gpu_minutes_limit}]
                entry["max"] = {"tres": {"group": {"minutes": limit}}}
            encoded.append(entry)
        return {"associations": encoded}

    def decode_associations(self, body: Json) -> list[AssociationInfo]:
        associations = []
        for raw in body.get("associations") or []:
            tres = (raw.get("max") or {}).get("tres") or {}
            minutes = (tres.get("group") or {}).get("minutes") or (tres.get("minutes") or {}).get("total") or []
            associations.append(
                AssociationInfo(
                    account=raw.get("account") or "",
                    cluster=raw.get("cluster") or "",
                    user=raw.get("user") or "",
                    parent_account=raw.get("parent_account") or "",
                    gpu_minutes_limit=untyped_gpu_count(minutes),
                )
            )
        return associations


def _accounting_exit_code(exit_code: Any, state: JobState) -> int | None:
    """The exit code of a dbv0.0.38 record, where 22.05 keeps it.

    22.05's dumper writes every normal exit as `{status: "SUCCESS", return_code: 0}`: measured here, a job
    ending in `exit 3` reads so while sacct shows its 3:0. A signal is kept (`SIGNALED`, `signal_id` 9 for
    SIGKILL). So a SUCCESS says the code only where the state implies it: 0 for COMPLETED; else it is unknown.
    """
    if not isinstance(exit_code, dict):
        return None
    if exit_code.get("status") == "SUCCESS" and state is not JobState.COMPLETED:
        return None
    return shell_exit_code(exit_code)


CODEC = V0038Codec()
