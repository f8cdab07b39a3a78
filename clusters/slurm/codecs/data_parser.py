"""What the data_parser API versions (v0.0.40 to v0.0.45) share: one codec, with per-version hooks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
from clusters.slurm.errors import SlurmRejected
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

# slurmctld refuses a batch job whose environment is empty ("Environment is missing in job",
# ESLURM_ENVIRONMENT_MISSING) although the v0.0.40+ schemas no longer mark the field required. A
# submission may carry none, so it gets the smallest one a batch shell needs: a PATH.
MINIMAL_ENVIRONMENT = ("PATH=/usr/bin:/bin",)


class DataParserCodec(Codec):
    """Encodes and decodes the data_parser shapes; subclasses override only what their version changed.

    The defaults here are those of v0.0.42 and later; `V0041Codec` (and `V0040Codec` after it) restores the
    few older names.
    """

    # Flag of GET /slurmdb/vX/associations/ that includes deleted ones. v0.0.42 renamed every flag
    # of that query to its description string (`with_deleted` -> "Include deleted associations").
    include_deleted_associations_parameter = "Include deleted associations"
    # Job info fields holding the output paths, preferred first.
    stdout_fields: tuple[str, ...] = ("standard_output",)
    stderr_fields: tuple[str, ...] = ("standard_error",)

    # Replies ----------------------------------------------------------------------------------------

    def decode_errors(self, body: Json) -> tuple[SlurmMessage, ...]:
        return _messages(body.get("errors"))

    def decode_warnings(self, body: Json) -> tuple[SlurmMessage, ...]:
        return _messages(body.get("warnings"))

    def decode_ping(self, body: Json) -> tuple[bool, str | None, str | None]:
        pings = [ping for ping in _list(body.get("pings")) if isinstance(ping, dict)]
        # A backup controller that is down does not stop the primary from answering.
        responding = any(self._ping_responding(ping) for ping in pings)
        slurm = _dict(_dict(body.get("meta")).get("slurm"))
        return responding, _text(slurm.get("release")) or None, _text(slurm.get("cluster")) or None

    def _ping_responding(self, ping: Json) -> bool:
        return ping.get("responding") is True

    # Jobs -------------------------------------------------------------------------------------------

    def encode_submit(self, submission: JobSubmission) -> Json:
        environment = [f"{key}={value}" for key, value in submission.environment.items()]
        job: Json = {
            # Inside `job`: the top-level `script` is deprecated in the v0.0.41-v0.0.44 schemas.
            "script": submission.script,
            "name": submission.name,
            "account": submission.account,
            "partition": submission.partition,
            "comment": submission.comment,
            "environment": environment or list(MINIMAL_ENVIRONMENT),
            "current_working_directory": submission.working_directory,
            "standard_output": submission.standard_output,
            "standard_error": submission.standard_error,
            "time_limit": _number_struct(submission.time_limit_minutes),
            "nodes": str(submission.nodes),
            "hold": submission.hold,
        }
        if submission.array:
            job["array"] = submission.array
        if submission.dependency:
            job["dependency"] = submission.dependency
        if submission.gpus and submission.nodes > 1:
            # What `sbatch --gpus-per-node` sends: the same GPUs on every node of a multi-node job.
            job["tres_per_node"] = f"gres/gpu:{submission.gpu_spec}"
        elif submission.gpus:
            # These versions have no `gpus`/`gres` job fields: slurmrestd would drop them with a mere
            # warning. `tres_per_job` is what `sbatch --gpus` sends.
            job["tres_per_job"] = f"gres/gpu:{submission.gpu_spec}"
        if submission.max_switches is not None:
            # `--switches=N@wait`; without a wait Slurm applies its max_switch_wait (300 s by default).
            job["required_switches"] = _number_struct(submission.max_switches)
            if submission.switch_wait_seconds is not None:
                job["wait_for_switch"] = submission.switch_wait_seconds
        if submission.cpus is not None:
            # One task with `cpus` CPUs, as `sbatch -c`; minimum_cpus makes the total explicit.
            job["cpus_per_task"] = submission.cpus
            job["minimum_cpus"] = submission.cpus
        if submission.memory_mb is not None:
            job["memory_per_node"] = _number_struct(submission.memory_mb)
        return {"job": job}

    def decode_submit(self, body: Json) -> SubmitResult:
        job_id = plain_number(body.get("job_id"))
        if not job_id:
            raise SlurmRejected("slurmrestd returned no job id", messages=self.decode_errors(body))
        return SubmitResult(
            job_id=job_id,
            # Errors beside a job id did not stop the job (a held job comes with one): keep them as warnings.
            warnings=self.decode_warnings(body) + self.decode_errors(body),
            user_message=_text(body.get("job_submit_user_msg")),
        )

    def decode_jobs(self, body: Json) -> JobsListing:
        jobs = tuple(self._decode_job(raw) for raw in _list(body.get("jobs")) if isinstance(raw, dict))
        return JobsListing(jobs=jobs, last_update=timestamp(body.get("last_update")))

    def _decode_job(self, raw: Json) -> SlurmJob:
        state = JobState.parse(raw.get("job_state"))
        nodes = _text(raw.get("nodes"))
        gpus, gpu_type = self._job_gpus(raw)
        standard_output, standard_error = self._output_paths(raw)
        # slurmctld fills start_time and end_time of a pending or running job with its forecast (begin
        # time, start + time limit), and start_time of a job cancelled before it got nodes with the
        # cancel time: none of these is a time the job started or ended.
        started = state is not JobState.PENDING and bool(nodes)
        return SlurmJob(
            job_id=int(raw["job_id"]),
            name=_text(raw.get("name")),
            account=_text(raw.get("account")),
            partition=_text(raw.get("partition")),
            user_name=_text(raw.get("user_name")),
            state=state,
            state_reason=_text(raw.get("state_reason")) or "None",
            comment=_text(raw.get("comment")),
            submit_time=timestamp(raw.get("submit_time")),
            start_time=timestamp(raw.get("start_time")) if started else None,
            end_time=timestamp(raw.get("end_time")) if state.is_finished else None,
            time_limit_minutes=plain_number(raw.get("time_limit")),
            gpus=gpus,
            gpu_type=gpu_type,
            nodes=nodes,
            # Until the job ends its exit_code reads {SUCCESS, 0}, which is not a result yet; a job that never got
            # nodes (cancelled while pending, BadConstraints) has slurmctld's 1, which would read as signal 1.
            exit_code=shell_exit_code(raw.get("exit_code")) if state.is_finished and started else None,
            standard_output=standard_output,
            standard_error=standard_error,
            restart_count=plain_number(raw.get("restart_cnt")) or 0,
            gpu_indices=gpu_indices_by_node(nodes=nodes, gres_detail=_gres_strings(raw.get("gres_detail"))),
            expected_start_time=timestamp(raw.get("start_time")) if state is JobState.PENDING else None,
            **job_array_fields(raw),
        )

    def _job_gpus(self, raw: Json) -> tuple[int, str | None]:
        """GPUs the job holds, else the ones it asked for; and their type when a single one is named.

        In order: `tres_alloc_str` (has gres/gpu only where AccountingStorageTRES tracks it, which none of
        the recorded clusters did), `gres_detail` (one entry per allocated node, gone once the job ends),
        then the request: per job, per node x nodes, per task x tasks, per socket x nodes. The recorded
        `--gpus-per-socket 2 --sockets-per-node 2` one-CPU jobs were given 2 GPUs, not 4 (only the
        socket their core sits on counts), so a per-socket request is counted once per node.
        """
        requested, requested_type = self._requested_gpus(raw)
        for source in (raw.get("tres_alloc_str"), raw.get("gres_detail")):
            held, held_type = gpus_in(_gres_strings(source))
            if held:
                return held, held_type or requested_type
        return requested, requested_type

    def _requested_gpus(self, raw: Json) -> tuple[int, str | None]:
        nodes = max(plain_number(raw.get("node_count")) or 1, 1)
        tasks = max(plain_number(raw.get("tasks")) or 1, 1)
        for field, multiplier in (
            ("tres_per_job", 1),
            ("tres_per_node", nodes),
            ("tres_per_task", tasks),
            ("tres_per_socket", nodes),
        ):
            count, gpu_type = gpus_in(_gres_strings(raw.get(field)))
            if count:
                return count * multiplier, gpu_type
        return 0, None

    def _output_paths(self, raw: Json) -> tuple[str, str]:
        """(stdout, stderr) paths of a job as the user finds them: the first non-blank of each field list.

        From 25.11 the stderr path is blank unless set explicitly, in every API version it serves
        (25.11/0.0.41 slurm-job-completed.json has standard_error ""): blank means "same as stdout".
        """
        standard_output = next(filter(None, (_text(raw.get(key)) for key in self.stdout_fields)), "")
        standard_error = next(filter(None, (_text(raw.get(key)) for key in self.stderr_fields)), "")
        return standard_output, standard_error or standard_output

    def decode_signal_failures(self, body: Json) -> tuple[SlurmMessage, ...]:
        # `status[]`: one entry per job signalled, `error.code` 0 when it was. Measured on 24.11 and 26.05: another
        # user's cancel answers HTTP 200, errors[] empty, and {error: {code: 2002, string: "Access/permission
        # denied"}} here.
        failures = []
        for entry in _list(body.get("status")):
            error = _dict(_dict(entry).get("error"))
            code = plain_number(error.get("code"))
            if code:
                text = _text(error.get("message")) or _text(error.get("string")) or f"Slurm error {code}"
                failures.append({"error_number": code, "description": f"job {_job_id_text(entry)}: {text}"})
        return messages_from(failures, text_keys=("description",))

    def decode_accounting_jobs(self, body: Json) -> list[AccountingRecord]:
        return [self._decode_accounting_job(raw) for raw in _list(body.get("jobs")) if isinstance(raw, dict)]

    def _decode_accounting_job(self, raw: Json) -> AccountingRecord:
        state = JobState.parse(_dict(raw.get("state")).get("current"))
        time = _dict(raw.get("time"))
        tres = _dict(raw.get("tres"))
        gpus, gpu_type = gpus_in_tres_list(_list(tres.get("allocated")))
        comment = raw.get("comment")
        gpu_utilisation, gpu_memory = gpu_usage_in_steps(_list(raw.get("steps")))
        return AccountingRecord(
            job_id=int(raw["job_id"]),
            name=_text(raw.get("name")),
            account=_text(raw.get("account")),
            user_name=_text(raw.get("user")),
            partition=_text(raw.get("partition")),
            cluster=_text(raw.get("cluster")),
            state=state,
            # {administrator, job, system}: only `job` is what the submitter wrote (the portal's tag).
            comment=_text(comment.get("job")) if isinstance(comment, dict) else _text(comment),
            submit_time=timestamp(time.get("submission")),
            start_time=timestamp(time.get("start")) if state is not JobState.PENDING else None,
            end_time=timestamp(time.get("end")) if state.is_finished else None,
            elapsed_seconds=plain_number(time.get("elapsed")) or 0,
            gpus_allocated=gpus,
            gpu_type=gpu_type,
            # The job's own record: slurmdbd notes a time limit's or scancel's signal on the batch step only.
            exit_code=shell_exit_code(raw.get("exit_code")) if state.is_finished else None,
            nodes=accounting_nodes(raw.get("nodes")),
            time_limit_minutes=plain_number(time.get("limit")),
            gpu_utilisation_percent=gpu_utilisation,
            gpu_memory_peak_bytes=gpu_memory,
            **accounting_array_fields(raw),
        )

    # Cluster ----------------------------------------------------------------------------------------

    def decode_nodes(self, body: Json) -> list[NodeInfo]:
        nodes = []
        for raw in _list(body.get("nodes")):
            if not isinstance(raw, dict):
                continue
            flags = tuple(_text(flag) for flag in _list(raw.get("state")))
            gpus_total, gpu_type = gpus_in(_gres_strings(raw.get("gres")))
            gpus_used, _ = gpus_in(_gres_strings(raw.get("gres_used")))
            nodes.append(
                NodeInfo(
                    name=_text(raw.get("name")),
                    state=NodeState.from_flags(list(flags)),
                    state_flags=flags,
                    reason=_text(raw.get("reason")),
                    partitions=tuple(_text(name) for name in _list(raw.get("partitions"))),
                    cpus=plain_number(raw.get("cpus")) or 0,
                    cpus_allocated=plain_number(raw.get("alloc_cpus")) or 0,
                    real_memory_mb=plain_number(raw.get("real_memory")) or 0,
                    gpu_type=gpu_type,
                    gpus_total=gpus_total,
                    gpus_used=gpus_used,
                    switch=switch_from_features(_gres_strings(raw.get("features"))),
                )
            )
        return nodes

    def decode_partitions(self, body: Json) -> list[PartitionInfo]:
        partitions = []
        for raw in _list(body.get("partitions")):
            if not isinstance(raw, dict):
                continue
            states = [_text(state) for state in _list(_dict(raw.get("partition")).get("state"))]
            flags = {flag.upper() for flag in states + [_text(flag) for flag in _list(raw.get("flags"))]}
            partitions.append(
                PartitionInfo(
                    name=_text(raw.get("name")),
                    nodes=expand_hostlist(_text(_dict(raw.get("nodes")).get("configured"))),
                    # Infinite (and unset) limits come back as None: no limit.
                    max_time_minutes=plain_number(_dict(raw.get("maximums")).get("time")),
                    default_time_minutes=plain_number(_dict(raw.get("defaults")).get("time")),
                    # Default=YES shows only from v0.0.45, as `flags: ["DEFAULT"]`; v0.0.40-v0.0.44 have no
                    # marker for it.
                    is_default="DEFAULT" in flags,
                    state=",".join(states) or "UNKNOWN",
                )
            )
        return partitions

    # Accounts, associations and limits -------------------------------------------------------------

    def encode_accounts(self, accounts: Iterable[AccountInfo], *, parent_account: str | None) -> Json:
        # The account records have no parent field in these versions (slurmrestd would ignore one with a
        # warning): the parent is set by the account's association, which the client writes next.
        return {
            "accounts": [
                {
                    "name": account.name,
                    "description": account.description,
                    "organization": account.organization,
                }
                for account in accounts
            ]
        }

    def encode_account_creation(
        self, account: AccountInfo, *, cluster: str, parent_account: str, gpu_minutes_limit: int | None
    ) -> tuple[str, Json] | None:
        # Measured on 24.11 (v0.0.42): POST /associations/ creates a new account association without its
        # `parent_account` (the account hangs outside the tree, gets no QOS, and its jobs are refused with
        # "Invalid qos specification"), although it honours the field when it modifies one. This request
        # creates the account under its parent; for an account that exists it changes nothing (HTTP 304).
        association: Json = {"parent": parent_account or "root"}
        if gpu_minutes_limit is not None:
            association["grptresmins"] = [{"type": "gres", "name": "gpu", "count": gpu_minutes_limit}]
        payload: Json = {
            "association_condition": {"accounts": [account.name], "clusters": [cluster], "association": association},
            "account": {"description": account.description, "organization": account.organization},
        }
        return "/accounts_association/", payload

    def decode_accounts(self, body: Json) -> list[AccountInfo]:
        return [
            AccountInfo(
                name=_text(raw.get("name")),
                description=_text(raw.get("description")),
                organization=_text(raw.get("organization")),
            )
            for raw in _list(body.get("accounts"))
            if isinstance(raw, dict)
        ]

    def encode_associations(self, associations: Iterable[AssociationInfo]) -> Json:
        encoded = []
        for association in associations:
            # `user` is required by the schema: "" names the account's own association.
            entry: Json = {
                "account": association.account,
                "cluster": association.cluster,
                "user": association.user,
            }
            if association.parent_account:
                entry["parent_account"] = association.parent_account
            if association.gpu_minutes_limit is not None:
                limit = [{"type": "gres", "name": "gpu", "count": association.gpu_minutes_limit}]
                entry["max"] = {"tres": {"group": {"minutes": limit}}}
            encoded.append(entry)
        return {"associations": encoded}

    def decode_associations(self, body: Json) -> list[AssociationInfo]:
        associations = []
        for raw in _list(body.get("associations")):
            if not isinstance(raw, dict):
                continue
            group = _dict(_dict(_dict(raw.get("max")).get("tres")).get("group"))
            associations.append(
                AssociationInfo(
                    account=_text(raw.get("account")),
                    cluster=_text(raw.get("cluster")),
                    user=_text(raw.get("user")),
                    parent_account=_text(raw.get("parent_account")),
                    gpu_minutes_limit=untyped_gpu_count(_list(group.get("minutes"))),
                )
            )
        return associations

    def association_query_params(
        self,
        *,
        account: str | None = None,
        user: str | None = None,
        cluster: str | None = None,
        include_deleted: bool = False,
    ) -> dict[str, str]:
        """Query of GET /slurmdb/vX/associations/, with this version's name for the deleted flag."""
        given = {"account": account, "user": user, "cluster": cluster}
        params = {key: value for key, value in given.items() if value}
        if include_deleted:
            params[self.include_deleted_associations_parameter] = "true"
        return params


# Helpers --------------------------------------------------------------------------------------------


def _messages(items: Any) -> tuple[SlurmMessage, ...]:
    """`errors[]`/`warnings[]`: `description` says what failed, `error` is the errno's text; both help.

    errno 0 comes with the text "No error", which would only confuse.
    """
    described = []
    for item in _list(items):
        if not isinstance(item, Mapping):
            continue
        description, error = _text(item.get("description")), _text(item.get("error"))
        if error and error != "No error" and error not in description:
            description = f"{description}: {error}" if description else error
        described.append({**item, "description": description})
    return messages_from(described, text_keys=("description",))


def _number_struct(number: int) -> Json:
    return {"set": True, "infinite": False, "number": number}


def _gres_strings(value: Any) -> list[str]:
    """The gres/TRES strings of a field that holds one string or a list of them."""
    return [value] if isinstance(value, str) else [item for item in _list(value) if isinstance(item, str)]


def _job_id_text(entry: Any) -> str:
    job_id = _dict(entry).get("job_id")
    return str(plain_number(job_id) if isinstance(job_id, dict) else job_id)


def _dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
