"""A burst of job submissions through the portal's REST API, as a careful automation client sends them.

Each job gets its own `Idempotency-Key`; a connection error or a 5xx is retried with the same key (so a
request that reached the portal but lost its reply cannot create a second job), a 4xx is a refusal and is
recorded with the portal's message. The burst runs in a background thread so a drill can cause its fault
while the submissions go on.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from harness import Drill

# A small job: one GPU on partition debug, a few seconds of work.
JOB_SCRIPT = "#!/bin/bash\necho drill job $SLURM_JOB_ID\nsleep 2\necho done\n"
# How long one submission keeps retrying (connection errors, 5xx) before the client gives up on it.
RETRY_FOR_SECONDS = 180
RETRY_PAUSE_SECONDS = 1.0


@dataclass
class Submission:
    """One job the client tried to submit, and what the portal answered in the end."""

    key: str  # the Idempotency-Key, the same on every retry
    number: int
    job_id: str | None = None  # the portal's id, once accepted (202, or 200 for a retry of an accepted key)
    status: int | None = None  # the last HTTP status, None when no reply ever came
    refusal: str = ""  # a 4xx's message: why the portal refused the job
    attempts: int = 0
    problems: list[str] = field(default_factory=list)  # connection errors and 5xx met on the way
    sent_at: float | None = None  # time.monotonic() of the first attempt
    answered_at: float | None = None  # time.monotonic() of the final answer (accepted or refused)

    @property
    def accepted(self) -> bool:
        return self.job_id is not None

    @property
    def refused(self) -> bool:
        return self.status is not None and 400 <= self.status < 500


def job_body(drill: Drill, number: int, **overrides: Any) -> dict[str, Any]:
    """The JSON of one small job in the drill's project; `overrides` change fields (script, time limit...)."""
    return {
        "project": drill.world.project_label,
        "cluster": "local",
        "partition": "debug",
        "gpus": 1,
        "time_limit_minutes": 2,
        "name": f"drill-{drill.name}-{number}",
        "script": JOB_SCRIPT,
        **overrides,
    }


def submit(http: httpx.Client, body: dict[str, Any], submission: Submission) -> Submission:
    """POST one job until the portal accepts or refuses it, or RETRY_FOR_SECONDS pass; fills `submission`."""
    submission.sent_at = time.monotonic()
    deadline = submission.sent_at + RETRY_FOR_SECONDS
    while True:
        submission.attempts += 1
        try:
            response = http.post("/api/v1/jobs/", json=body, headers={"Idempotency-Key": submission.key})
        except httpx.TransportError as exc:
            submission.problems.append(f"{type(exc).__name__}: {exc}")
        else:
            submission.status = response.status_code
            if response.status_code in (200, 202):
                submission.job_id = response.json()["id"]
                submission.answered_at = time.monotonic()
                return submission
            if 400 <= response.status_code < 500:
                submission.refusal = _error_message(response)
                submission.answered_at = time.monotonic()
                return submission
            submission.problems.append(f"HTTP {response.status_code}: {_error_message(response)}")
        if time.monotonic() > deadline:
            return submission
        time.sleep(RETRY_PAUSE_SECONDS)


def _error_message(response: httpx.Response) -> str:
    """The portal's error message (portal/api_errors.py's shape), or the start of whatever came instead."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if not isinstance(body, dict) or "message" not in body:
        return str(body)[:500]
    fields = "; ".join(f"{name}: {' '.join(problems)}" for name, problems in (body.get("fields") or {}).items())
    return f"{body['message']} {fields}".strip()


class Burst:
    """`count` submissions from `concurrency` threads, paced at `per_second` at most, in a background thread."""

    def __init__(
        self, drill: Drill, *, count: int = 200, concurrency: int = 10, per_second: float = 4.0, **job: Any
    ) -> None:
        self.drill = drill
        self.count = count
        self.concurrency = concurrency
        self.interval = 1 / per_second
        self.job = job
        self.submissions = [Submission(key=f"drill-{uuid.uuid4()}", number=number) for number in range(1, count + 1)]
        self._thread = threading.Thread(target=self._run, name="burst", daemon=True)
        self._next_send = time.monotonic()
        self._pace = threading.Lock()

    @classmethod
    def start(cls, drill: Drill, **options: Any) -> Burst:
        burst = cls(drill, **options)
        drill.say(
            f"burst started: {burst.count} jobs, {burst.concurrency} concurrent clients, "
            f"at most {1 / burst.interval:.0f} submissions/s"
        )
        burst._thread.start()
        return burst

    def _paced(self) -> None:
        """Wait for this submission's slot: the burst lasts long enough for a fault to fall inside it."""
        with self._pace:
            slot = self._next_send
            self._next_send = max(slot, time.monotonic()) + self.interval
        time.sleep(max(0.0, slot - time.monotonic()))

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.drill.world.token}"}
        numbers = itertools.count()
        with (
            httpx.Client(base_url=self.drill.portal.base_url, headers=headers, timeout=30) as http,
            ThreadPoolExecutor(max_workers=self.concurrency) as pool,
        ):

            def one() -> None:
                self._paced()
                submission = self.submissions[next(numbers)]
                submit(http, job_body(self.drill, submission.number, **self.job), submission)

            for future in [pool.submit(one) for _ in self.submissions]:
                future.result()

    @property
    def accepted(self) -> int:
        return sum(submission.accepted for submission in self.submissions)

    @property
    def answered(self) -> int:
        return sum(submission.accepted or submission.refused for submission in self.submissions)

    def wait_accepted(self, count: int, *, timeout_seconds: float = 120) -> bool:
        """Wait until `count` jobs were accepted (or the burst ended)."""
        deadline = time.monotonic() + timeout_seconds
        while self.accepted < count and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.accepted >= count

    def wait(self) -> None:
        """Wait for the end of the burst, and say how it went."""
        self._thread.join()
        retried = [submission for submission in self.submissions if submission.problems]
        refused = [submission for submission in self.submissions if submission.refused]
        unanswered = [
            submission for submission in self.submissions if not submission.accepted and not submission.refused
        ]
        self.drill.say(
            f"burst done: {self.accepted} accepted, {len(refused)} refused, {len(unanswered)} never answered; "
            f"{len(retried)} needed retries ({sum(len(s.problems) for s in retried)} failed attempts)"
        )
        problems = sorted({problem.split(":")[0] for submission in retried for problem in submission.problems})
        if problems:
            self.drill.say(f"  failed attempts were: {', '.join(problems)}")
