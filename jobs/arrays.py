"""Job arrays: the index expression a submission carries (`0-99%10`, `1,5,9`, `0-20:4`), read as `sbatch --array`
reads it, checked with words a user can act on, and the per-task output paths Slurm writes."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from jobs.models import Job, JobArrayTask, JobState

# `sbatch --array` items: N, N-M, N-M:STEP; the whole expression may end in %LIMIT (the most tasks running at once).
_ITEM = re.compile(r"^(?P<first>\d{1,7})(?:-(?P<last>\d{1,7})(?::(?P<step>\d{1,7}))?)?$")
ARRAY_EXPRESSION_MAX_LENGTH = 200


@dataclass(frozen=True)
class ArraySpec:
    """A checked array expression: `expression` goes to Slurm as given (without spaces)."""

    expression: str
    indexes: tuple[int, ...]  # ascending, each once
    max_running: int | None  # the `%N` cap; None: as many as fit

    @property
    def task_count(self) -> int:
        return len(self.indexes)


class ArrayExpressionError(ValueError):
    """The expression cannot be read; the message says what to write instead."""


def array_parse(expression: str, *, max_array_size: int | None = None) -> ArraySpec:
    """Read an array expression, or raise ArrayExpressionError naming the problem.

    `max_array_size` is Slurm's MaxArraySize (every index must be below it; Slurm's default is 1001), else the
    JOB_ARRAY_MAX_SIZE setting.
    """
    limit = max_array_size or settings.JOB_ARRAY_MAX_SIZE
    text = expression.replace(" ", "")
    if not text:
        raise ArrayExpressionError("Give the task indexes, such as '0-99', '1,5,9' or '0-99%10'.")
    if len(text) > ARRAY_EXPRESSION_MAX_LENGTH:
        raise ArrayExpressionError(f"Use at most {ARRAY_EXPRESSION_MAX_LENGTH} characters; this has {len(text)}.")
    ranges, _, cap = text.partition("%")
    max_running: int | None = None
    if _:
        if not cap.isdigit() or int(cap) < 1:
            raise ArrayExpressionError(
                f"'%{cap}' is not a limit of running tasks: write '%' and a number of at least 1, as in '0-99%10'."
            )
        max_running = int(cap)
    indexes: set[int] = set()
    for item in ranges.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise ArrayExpressionError(
                f"'{item[:40]}' is not a task index or range: write N, N-M or N-M:STEP (such as 3, 0-99 or 0-99:2), "
                "separated by commas."
            )
        first = int(match["first"])
        last = int(match["last"]) if match["last"] is not None else first
        step = int(match["step"]) if match["step"] is not None else 1
        if last < first:
            raise ArrayExpressionError(f"The range '{item}' ends before it starts; write it as {last}-{first}.")
        if step < 1:
            raise ArrayExpressionError(f"The step of '{item}' must be at least 1.")
        if last >= limit:
            raise ArrayExpressionError(
                f"Task indexes must be below {limit} (the cluster's MaxArraySize); '{item}' goes up to {last}."
            )
        indexes.update(range(first, last + 1, step))
    return ArraySpec(expression=text, indexes=tuple(sorted(indexes)), max_running=max_running)


def array_output_path(pattern: str, *, array_job_id: int | None, task_index: int) -> str:
    """The path of one task's output: `%A` (the array's Slurm job id) and `%a` (the task index) filled in."""
    path = pattern.replace("%a", str(task_index))
    return path.replace("%A", str(array_job_id)) if array_job_id is not None else path


# How an array's progress is counted: every task state falls in one of these.
PROGRESS_OF_STATE = {
    JobState.QUEUED: "pending",
    JobState.PENDING: "pending",
    JobState.RUNNING: "running",
    JobState.COMPLETED: "completed",
    JobState.FAILED: "failed",
    JobState.TIMEOUT: "failed",
    JobState.NODE_FAIL: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.REJECTED: "cancelled",
}
PROGRESS_KEYS = ("pending", "running", "completed", "failed", "cancelled")


def array_progress(states: Iterable[str]) -> dict[str, int]:
    """`{pending, running, completed, failed, cancelled}` counts of these task states."""
    counts = Counter(PROGRESS_OF_STATE[JobState(state)] for state in states)
    return {key: counts.get(key, 0) for key in PROGRESS_KEYS}


def array_tasks_end_before_slurm(*, job: Job, state: JobState, now: datetime) -> None:
    """End every task of an array that never reached Slurm (cancelled in the portal, or rejected), and its progress
    with them; the caller saves `array_progress` with the job. Nothing for a plain job."""
    if not job.is_array:
        return
    JobArrayTask.objects.filter(job=job).update(state=state, ended_at=now, updated_at=now)
    job.array_progress = array_progress([state] * job.array_task_count)
