"""What every API-version codec provides, and the parsing helpers they share."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from clusters.slurm.types import (
    AccountInfo,
    AccountingRecord,
    AssociationInfo,
    JobsListing,
    JobSubmission,
    NodeInfo,
    PartitionInfo,
    SlurmMessage,
    SubmitResult,
)

Json = dict[str, Any]

# Slurm's NO_VAL/INFINITE sentinels leak into integer fields of the older plugins.
SLURM_NO_VALUE_32 = 0xFFFFFFFE
SLURM_INFINITE_32 = 0xFFFFFFFF
SLURM_NO_VALUE_64 = 0xFFFFFFFFFFFFFFFE
SLURM_INFINITE_64 = 0xFFFFFFFFFFFFFFFF
_SENTINELS = {SLURM_NO_VALUE_32, SLURM_INFINITE_32, SLURM_NO_VALUE_64, SLURM_INFINITE_64}

# "gpu:h100:4(S:0-1)", "gpu:4", "gpu:a100:2(IDX:0-1)", "gres/gpu:h100=4" and "gres/gpu=4" all name GPUs.
_GRES_ITEM = re.compile(r"^(?:gres[/:])?gpu(?::(?P<type>[^:=(]+))?[:=](?P<count>\d+)")


class Codec(ABC):
    """Encodes requests for, and decodes replies of, one slurmrestd API version into the normalised types."""

    version: str  # "0.0.38"

    # Errors some versions report for an association write they nonetheless applied; the client
    # tolerates them only because it reads every limit back.
    tolerated_association_errors: frozenset[str] = frozenset()
    # Whether an account's own association can only be modified by moving it to another parent (22.05).
    account_limit_needs_parent_move: bool = False

    @property
    def slurm_prefix(self) -> str:
        return f"/slurm/v{self.version}"

    @property
    def slurmdb_prefix(self) -> str:
        return f"/slurmdb/v{self.version}"

    # Replies -----------------------------------------------------------------------------------

    def is_auth_failure(self, message: SlurmMessage) -> bool:
        """Whether an error means the token was refused, beyond the error numbers every version shares."""
        return False

    @abstractmethod
    def decode_errors(self, body: Json) -> tuple[SlurmMessage, ...]: ...

    @abstractmethod
    def decode_warnings(self, body: Json) -> tuple[SlurmMessage, ...]: ...

    @abstractmethod
    def decode_ping(self, body: Json) -> tuple[bool, str | None, str | None]:
        """(controller responding, Slurm release, cluster name) from a ping reply."""

    # Jobs --------------------------------------------------------------------------------------

    @abstractmethod
    def encode_submit(self, submission: JobSubmission) -> Json: ...

    @abstractmethod
    def decode_submit(self, body: Json) -> SubmitResult: ...

    @abstractmethod
    def decode_jobs(self, body: Json) -> JobsListing:
        """A GET /job/{id} or GET /jobs reply."""

    @abstractmethod
    def decode_accounting_jobs(self, body: Json) -> list[AccountingRecord]:
        """A GET /slurmdb/.../jobs or /job/{id} reply."""

    def decode_signal_failures(self, body: Json) -> tuple[SlurmMessage, ...]:
        """The refusals in a DELETE /job/{id} reply that are not in its errors[] (none before v0.0.40)."""
        return ()

    def encode_accounting_time(self, moment: datetime, *, now: datetime) -> str:
        """A `start_time`/`end_time` query value for accounting queries: epoch seconds."""
        return str(epoch(moment))

    # Cluster -----------------------------------------------------------------------------------

    @abstractmethod
    def decode_nodes(self, body: Json) -> list[NodeInfo]: ...

    @abstractmethod
    def decode_partitions(self, body: Json) -> list[PartitionInfo]: ...

    # Accounts, associations and limits ---------------------------------------------------------

    @abstractmethod
    def encode_accounts(self, accounts: Iterable[AccountInfo], *, parent_account: str | None) -> Json: ...

    @abstractmethod
    def decode_accounts(self, body: Json) -> list[AccountInfo]: ...

    @abstractmethod
    def encode_associations(self, associations: Iterable[AssociationInfo]) -> Json:
        """Create or update associations; a `gpu_minutes_limit` is written as GrpTRESMins gres/gpu (-1 clears it)."""

    @abstractmethod
    def decode_associations(self, body: Json) -> list[AssociationInfo]: ...

    def encode_account_creation(
        self, account: AccountInfo, *, cluster: str, parent_account: str, gpu_minutes_limit: int | None
    ) -> tuple[str, Json] | None:
        """(path below the slurmdb prefix, payload) that creates an account with its association in one request.

        None where the version has no such request (v0.0.38): the account and its association are then written
        one after the other.
        """
        return None


# Shared helpers --------------------------------------------------------------------------------


def messages_from(items: Iterable[Mapping[str, Any]] | None, *, text_keys: tuple[str, ...]) -> tuple[SlurmMessage, ...]:
    """Slurm's `errors[]`/`warnings[]` entries; the text lives under different keys per version."""
    found: list[SlurmMessage] = []
    for item in items or ():
        # Slurm splits one message over keys ("error": the errno's text, "description": the detail); keep both.
        texts: list[str] = []
        for key in text_keys:
            value = item.get(key)
            if isinstance(value, str) and value and value not in texts:
                texts.append(value)
        text = ": ".join(texts)
        # v0.0.38 spells the number error_code on slurmctld replies and error_number on slurmdbd ones.
        number = item.get("error_number", item.get("error_code", item.get("errno")))
        source = item.get("source")
        found.append(
            SlurmMessage(
                description=text or "Slurm reported an error without a description",
                error_number=int(number) if isinstance(number, int) and number else None,
                source=source if isinstance(source, str) and source else None,
            )
        )
    return tuple(found)


def plain_number(value: Any) -> int | None:
    """An integer from a plain int, or from a v0.0.39+ `{set, infinite, number}` struct; None when unset/infinite."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if value in _SENTINELS:
        return None
    number: int = value
    return number


def _array_ids(job_id: Any, task_id: Any) -> tuple[int | None, int | None]:
    # Slurm says 0 for "not an array", and an unset (NO_VAL) task id for the record of the tasks not started yet.
    array_job_id = plain_number(job_id) or None
    return array_job_id, plain_number(task_id) if array_job_id is not None else None


def job_array_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The array fields of a job info record (GET /job/{id}, /jobs), the same names in every version; a plain
    number in v0.0.38, a `{set, infinite, number}` struct from v0.0.40."""
    array_job_id, array_task_id = _array_ids(raw.get("array_job_id"), raw.get("array_task_id"))
    task_string = raw.get("array_task_string")
    return {
        "array_job_id": array_job_id,
        "array_task_id": array_task_id,
        "array_task_string": task_string if isinstance(task_string, str) and array_job_id else "",
        "array_max_tasks": (plain_number(raw.get("array_max_tasks")) or None) if array_job_id else None,
    }


def accounting_array_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The array fields of an accounting record: `array: {job_id, task_id}` in every version (each task that
    ran has a record of its own)."""
    array = raw.get("array")
    if not isinstance(array, dict):
        return {"array_job_id": None, "array_task_id": None}
    array_job_id, array_task_id = _array_ids(array.get("job_id"), array.get("task_id"))
    return {"array_job_id": array_job_id, "array_task_id": array_task_id}


def accounting_nodes(value: Any) -> str:
    """The node list of an accounting record: slurmdbd says "None assigned" for a job that never got nodes."""
    nodes = value if isinstance(value, str) else ""
    return "" if nodes.strip().lower() in {"", "none assigned", "(null)"} else nodes


def shell_exit_code(value: Any) -> int | None:
    """A job's exit code as the shell reports it (`$?`): the return code, or 128 + N when signal N killed it.

    Reads every shape Slurm uses for it:
    - v0.0.38 job info: the raw wait status (768 for `exit 3`, 9 for SIGKILL);
    - dbv0.0.38 accounting: `{status: "SIGNALED", return_code, signal: {signal_id, name}}`;
    - v0.0.40+ job info and accounting: `{status: ["SIGNALED"], return_code: {set, infinite, number},
      signal: {id: {set, infinite, number}, name}}`.
    None when there is no result yet (PENDING, an unset number) or a signalled job does not say which signal.
    """
    if not isinstance(value, dict) or not {"status", "return_code", "signal"} & value.keys():
        wait_status = plain_number(value)
        return None if wait_status is None else _shell_code_of_wait_status(wait_status)
    status = value.get("status")
    statuses = {status} if isinstance(status, str) else {item for item in status or () if isinstance(item, str)}
    signal = value.get("signal")
    signal_number = plain_number(signal.get("id", signal.get("signal_id"))) if isinstance(signal, dict) else None
    if signal_number:
        return 128 + signal_number
    if "SIGNALED" in statuses:
        return None
    return plain_number(value.get("return_code"))


def _shell_code_of_wait_status(wait_status: int) -> int | None:
    # The layout of POSIX wait(2) statuses, decoded by hand so the result is the same on every platform.
    signal_number = wait_status & 0x7F
    if signal_number == 0:  # exited: the return code is the second byte
        return (wait_status >> 8) & 0xFF
    if signal_number == 0x7F:  # stopped, not ended
        return None
    return 128 + signal_number


def timestamp(value: Any) -> datetime | None:
    """A UTC datetime from epoch seconds (plain or struct); Slurm's 0 means 'not yet'."""
    seconds = plain_number(value)
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def gpus_in(items: str | Iterable[str] | None) -> tuple[int, str | None]:
    """Total GPUs and their type (if a single one is named) in gres or TRES strings.

    Accepts "gpu:h100:4(S:0)", "gres/gpu:h100=4,gres/gpu=4", "gres/gpu:2", or lists of these. When a string
    has both the untyped total and typed entries (as TRES strings do), the untyped total wins.
    """
    if items is None:
        return 0, None
    pieces: list[str] = []
    for item in [items] if isinstance(items, str) else items:
        pieces.extend(part.strip() for part in re.split(r",(?![^(]*\))", item) if part.strip())
    untyped_total: int | None = None
    typed_total = 0
    types: set[str] = set()
    for piece in pieces:
        match = _GRES_ITEM.match(piece)
        if not match:
            continue
        count = int(match.group("count"))
        gpu_type = match.group("type")
        if not count:  # a zero-count entry ("gpu:h200:0(IDX:)") names a type the job does not hold
            continue
        if gpu_type:
            typed_total += count
            types.add(gpu_type)
        else:
            untyped_total = (untyped_total or 0) + count
    total = untyped_total if untyped_total is not None else typed_total
    return total, (types.pop() if len(types) == 1 else None)


def gpus_in_tres_list(entries: list[Any]) -> tuple[int, str | None]:
    """GPUs in slurmdb TRES entries: `{type: "gres", name: "gpu", count: 2}` and typed `name: "gpu:h100"`."""
    names = [
        f"gres/{entry['name']}={count}"
        for entry in entries
        if isinstance(entry, dict)
        and entry.get("type") == "gres"
        and str(entry.get("name") or "").split(":")[0] == "gpu"
        and (count := plain_number(entry.get("count")))
    ]
    return gpus_in(names)


def untyped_gpu_count(entries: list[Any]) -> int | None:
    """The count of the untyped gres/gpu entry (what GrpTRESMins=gres/gpu=N sets); None without one."""
    for entry in entries:
        if isinstance(entry, dict) and entry.get("type") == "gres" and entry.get("name") == "gpu":
            count = plain_number(entry.get("count"))
            return count if count is not None and count >= 0 else None
    return None


def split_csv(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


_HOSTLIST_ITEM = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


# A node's leaf switch travels as a Slurm node feature: `Features=switch-leaf1` (README, "Multi-node jobs").
SWITCH_FEATURE_PREFIX = "switch-"


def switch_from_features(features: str | Iterable[str] | None) -> str:
    """The switch named by a node's features ("switch-leaf1,nvlink" or ["switch-leaf1"]): "leaf1"; "" if none."""
    items = features.split(",") if isinstance(features, str) else list(features or ())
    for item in items:
        if isinstance(item, str) and item.strip().startswith(SWITCH_FEATURE_PREFIX):
            return item.strip()[len(SWITCH_FEATURE_PREFIX) :]
    return ""


def expand_hostlist(value: str | None) -> tuple[str, ...]:
    """Slurm's compressed host lists: "gpu[01-03,07],login1" -> gpu01, gpu02, gpu03, gpu07, login1."""
    names: list[str] = []
    for match in _HOSTLIST_ITEM.finditer((value or "").replace(" ", "")):
        prefix, ranges, suffix = match.group(1).lstrip(","), match.group(2), match.group(3)
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                names.append(f"{prefix}{low}{suffix}")
                continue
            for number in range(int(low), int(high) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}{suffix}")
    return tuple(name for name in names if name)


# "gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)": the device indices after IDX, as ranges and single numbers.
_GRES_INDICES = re.compile(r"gpu[^(,]*\(IDX:(?P<indices>[^)]*)\)")


def gpu_indices_by_node(*, nodes: str, gres_detail: Iterable[str] | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Which GPU devices the job holds on each node: `gres_detail` has one entry per node of the job's node list,
    in order ("gpu:h100:2(IDX:0-1)"); an entry of a type the job does not hold reads "gpu:h200:0(IDX:)".

    Empty when Slurm does not say (pending, ended, or a reply without `gres_detail`)."""
    details = list(gres_detail or [])
    names = expand_hostlist(nodes)
    if not details or len(details) != len(names):
        return ()
    held: list[tuple[str, tuple[int, ...]]] = []
    for name, detail in zip(names, details, strict=True):
        indices: set[int] = set()
        for match in _GRES_INDICES.finditer(detail if isinstance(detail, str) else ""):
            for part in filter(None, match.group("indices").split(",")):
                low, _, high = part.partition("-")
                if low.isdigit() and (not high or high.isdigit()):
                    indices.update(range(int(low), int(high or low) + 1))
        if indices:
            held.append((name, tuple(sorted(indices))))
    return tuple(held)


def gpu_usage_in_steps(steps: Iterable[Any]) -> tuple[float | None, int | None]:
    """The job's GPU utilisation (percent) and peak GPU memory (bytes) from its steps' TRES usage, where Slurm
    records them: `AccountingStorageTRES` with `gres/gpuutil,gres/gpumem` and an NVML-built gpu plugin make each
    step carry `gres/gpuutil` and `gres/gpumem` in `tres.requested.{average,max}` (what `sacct` shows as
    TRESUsageInAve/TRESUsageInMax; seen on a real H200, tests/data/nvidia-h200/slurm-26.05-nvml*/, where
    accounting stored the step's peak reading as its "average" too, not a mean over time). None where no step
    carries them, which is not the same as zero.

    Utilisation is the highest step average (the batch step of a one-step job; the busiest step of several);
    memory the highest step maximum."""
    utilisation: float | None = None
    memory: int | None = None
    for step in steps:
        requested = (step.get("tres") or {}).get("requested") if isinstance(step, dict) else None
        if not isinstance(requested, dict):
            continue
        for entry in requested.get("average") or []:
            value = _gres_usage(entry, "gpuutil")
            if value is not None:
                utilisation = float(value) if utilisation is None else max(utilisation, float(value))
        for entry in requested.get("max") or []:
            value = _gres_usage(entry, "gpumem")
            if value is not None:
                memory = value if memory is None else max(memory, value)
    return utilisation, memory


def _gres_usage(entry: Any, name: str) -> int | None:
    if not isinstance(entry, dict) or entry.get("type") != "gres" or entry.get("name") != name:
        return None
    count = plain_number(entry.get("count"))
    return count if count is not None and count >= 0 else None
