"""Normalised Slurm types: every codec, whatever its API version, decodes into and encodes from these."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


class JobState(enum.StrEnum):
    """A job's base state, the same names Slurm uses (flags such as REQUEUED are dropped)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def is_finished(self) -> bool:
        return self in FINISHED_JOB_STATES

    @classmethod
    def parse(cls, raw: str | list[str] | None) -> JobState:
        """Slurm's state as a string (v0.0.38) or a list of a base state plus flags (v0.0.40+)."""
        names = [raw] if isinstance(raw, str) else list(raw or [])
        for name in names:
            try:
                return cls(name.upper())
            except ValueError:
                continue
        return cls.UNKNOWN


FINISHED_JOB_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
    }
)


class NodeState(enum.StrEnum):
    """A node's state as an operator reads it; drain and down win over the allocation state."""

    IDLE = "idle"
    MIXED = "mixed"
    ALLOCATED = "allocated"
    DRAINING = "draining"
    DRAINED = "drained"
    DOWN = "down"
    UNKNOWN = "unknown"

    @classmethod
    def from_flags(cls, flags: list[str]) -> NodeState:
        upper = {flag.upper() for flag in flags}
        base = next((f for f in ("DOWN", "ALLOCATED", "MIXED", "IDLE") if f in upper), None)
        if "DOWN" in upper or "NOT_RESPONDING" in upper:
            return cls.DOWN
        if "DRAIN" in upper:
            return cls.DRAINING if base in {"ALLOCATED", "MIXED"} else cls.DRAINED
        if base == "ALLOCATED":
            return cls.ALLOCATED
        if base == "MIXED":
            return cls.MIXED
        if base == "IDLE":
            return cls.IDLE
        return cls.UNKNOWN


@dataclass(frozen=True)
class SlurmMessage:
    """One entry of a reply's `errors[]` or `warnings[]`."""

    description: str
    error_number: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        if self.error_number:
            return f"{self.description} (Slurm error {self.error_number})"
        return self.description


@dataclass(frozen=True)
class JobSubmission:
    """What the portal asks Slurm to run. Values travel as data, never through a shell."""

    name: str
    account: str
    partition: str
    script: str
    time_limit_minutes: int
    working_directory: str
    standard_output: str
    standard_error: str
    gpus: int = 0  # on each node (`--gpus-per-node`); with one node, the job's GPUs (`--gpus`)
    gpu_type: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    comment: str = ""
    cpus: int | None = None
    memory_mb: int | None = None
    nodes: int = 1
    hold: bool = False
    # A job array's index expression as `sbatch --array` takes it ("0-99%10", "1,5,9"); "" for a plain job.
    array: str = ""
    # Other jobs it waits for, as `sbatch --dependency` takes it ("afterok:41:42,afterany:43"); "" for none.
    dependency: str = ""
    # `--switches=max_switches@switch_wait_seconds`: the most leaf switches the nodes may span, and the longest
    # the job waits for that (None: Slurm's max_switch_wait). API v0.0.38 refuses `required_switches` ("Disabled
    # key"): there one switch is asked for as `one_switch_constraint`, Slurm's matching-OR constraint over the
    # nodes' switch features ("[switch-leaf1|switch-leaf2]": all nodes share one of them), which never expires.
    max_switches: int | None = None
    switch_wait_seconds: int | None = None
    one_switch_constraint: str = ""

    @property
    def gpu_spec(self) -> str:
        """`h100:2` or `2`, the way `--gpus` spells a typed or untyped request."""
        return f"{self.gpu_type}:{self.gpus}" if self.gpu_type else str(self.gpus)


@dataclass(frozen=True)
class SubmitResult:
    job_id: int
    warnings: tuple[SlurmMessage, ...] = ()
    user_message: str = ""


@dataclass(frozen=True)
class SlurmJob:
    """A job as slurmctld reports it (GET /job/{id} and /jobs)."""

    job_id: int
    name: str
    account: str
    partition: str
    user_name: str
    state: JobState
    state_reason: str
    comment: str
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    time_limit_minutes: int | None
    gpus: int
    gpu_type: str | None
    nodes: str
    exit_code: int | None
    standard_output: str
    standard_error: str
    # How often Slurm put the job back in the queue (restart_cnt): after a node failure, a preemption or
    # `scontrol requeue`. The run now pending or running is attempt `restart_count + 1`.
    restart_count: int = 0
    # The GPU devices it holds on each node, from `gres_detail`: (("gpu01", (0, 1)),); empty when not said.
    gpu_indices: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # A pending job's start_time: the backfill scheduler's estimate of when it will start (None: none yet).
    expected_start_time: datetime | None = None
    # Job arrays: every record of one array shares `array_job_id` (the id the submission returned). A task that
    # Slurm has started (or finished) is a record of its own with its `array_task_id`; the tasks still waiting
    # share one record whose `array_task_id` is None and whose `array_task_string` names them ("2-19%4").
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_string: str = ""
    array_max_tasks: int | None = None  # the `%N` cap; None without one


@dataclass(frozen=True)
class JobsListing:
    """GET /jobs: the jobs and the controller's time of their last change, for the next `update_time`."""

    jobs: tuple[SlurmJob, ...]
    last_update: datetime | None


@dataclass(frozen=True)
class AccountingRecord:
    """A job as slurmdbd's accounting reports it (GET /slurmdb/.../jobs): what really ran."""

    job_id: int
    name: str
    account: str
    user_name: str
    partition: str
    cluster: str
    state: JobState
    comment: str
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    elapsed_seconds: int
    gpus_allocated: int
    gpu_type: str | None
    exit_code: int | None
    nodes: str = ""  # where it ran ("" until it has nodes)
    time_limit_minutes: int | None = None
    # From the steps' TRES usage (gres/gpuutil, gres/gpumem) where the cluster records it; None: not recorded.
    gpu_utilisation_percent: float | None = None
    gpu_memory_peak_bytes: int | None = None
    array_job_id: int | None = None  # the array this record is a task of (each task has its own record)
    array_task_id: int | None = None

    @property
    def gpu_seconds(self) -> int:
        return self.elapsed_seconds * self.gpus_allocated


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: NodeState
    state_flags: tuple[str, ...]
    reason: str
    partitions: tuple[str, ...]
    cpus: int
    cpus_allocated: int
    real_memory_mb: int
    gpu_type: str | None
    gpus_total: int
    gpus_used: int
    # Its leaf switch, from the node feature `switch-<name>` (slurmrestd shows no network topology before
    # Slurm 25.05, and 25.05+ only for dynamic nodes); "" when the node has none.
    switch: str = ""


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    max_time_minutes: int | None  # None: no limit
    default_time_minutes: int | None
    is_default: bool
    state: str


@dataclass(frozen=True)
class AccountInfo:
    name: str
    description: str
    organization: str


@dataclass(frozen=True)
class AssociationInfo:
    account: str
    cluster: str
    user: str  # "" for the account's own association
    parent_account: str
    gpu_minutes_limit: int | None  # GrpTRESMins gres/gpu; None: no limit


@dataclass(frozen=True)
class PingResult:
    api_version: str
    slurm_release: str | None
    cluster_name: str | None
    responding: bool
    latency_seconds: float
