"""Drill: a viewer's WebSockets dropped without a goodbye while the job's log grows, then reconnected.

A job prints numbered lines (and every tenth to stderr) for about 30 s. A viewer follows its log socket
(`/ws/jobs/{id}/log/`, Bearer token) and its state socket (`/ws/jobs/{id}/`). A few seconds in, both TCP
connections are aborted (no close frame, as when a laptop's Wi-Fi drops); a few seconds later the viewer
reconnects, the log socket with the `next_offset` of the last chunk it got per stream, and reads to `log.end`.
What it received must be the files byte for byte: every chunk starting where the previous one ended, no gap,
no line twice. The state socket must tell the job's states in order after the reconnect, ending completed.
Usage: python scripts/drills/drill_websocket.py
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness  # first: sets up Django on the drill's database
from burst import Burst
from ledger import ledger_check
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from jobs.models import Job, JobState

LINES = 300
SCRIPT = (
    "#!/bin/bash\n"
    f"for i in $(seq 1 {LINES}); do\n"
    '  echo "line $i of the drill log"\n'
    '  if (( i % 10 == 0 )); then echo "warning $i" >&2; fi\n'
    "  sleep 0.1\n"
    "done\n"
)
READ_BEFORE_DROP_SECONDS = 6
DROPPED_SECONDS = 4
END_TIMEOUT_SECONDS = 120
STREAMS = ("stdout", "stderr")


@dataclass
class LogViewer:
    """What one viewer holds of a job's log: the bytes per stream and where the next chunk must start."""

    received: dict[str, bytearray] = field(default_factory=lambda: {stream: bytearray() for stream in STREAMS})
    chunks: int = 0
    problems: list[str] = field(default_factory=list)
    ended: dict[str, Any] | None = None

    def offset(self, stream: str) -> int:
        return len(self.received[stream])

    def take(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "log.chunk":
            stream = message["stream"]
            if message["offset"] != self.offset(stream):
                self.problems.append(f"{stream} chunk at {message['offset']}, expected {self.offset(stream)}")
            data = message["data"].encode() if "data" in message else base64.b64decode(message["data_b64"])
            if message["next_offset"] - message["offset"] != len(data):
                self.problems.append(f"{stream} chunk at {message['offset']} holds {len(data)} bytes, not its span")
            self.received[stream] += data
            self.chunks += 1
        elif kind in ("log.truncated", "log.error"):
            self.problems.append(f"unexpected {kind}: {message}")
        elif kind == "log.end":
            self.ended = message


def query(viewer: LogViewer) -> str:
    return f"?stdout_offset={viewer.offset('stdout')}&stderr_offset={viewer.offset('stderr')}"


async def open_socket(drill: harness.Drill, path: str) -> ClientConnection:
    url = f"ws://127.0.0.1:{drill.portal.port}{path}"
    headers = {"Authorization": f"Bearer {drill.world.token}"}
    return await connect(url, additional_headers=headers, open_timeout=30, max_queue=None)


async def read_log(socket: ClientConnection, viewer: LogViewer, *, seconds: float) -> None:
    """Take the log socket's messages for `seconds`, or until it closes after `log.end`."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                viewer.take(json.loads(await asyncio.wait_for(socket.recv(), timeout=left)))
            except TimeoutError:
                return
    except ConnectionClosed:
        return


async def read_states(socket: ClientConnection, states: list[str], *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = json.loads(await asyncio.wait_for(socket.recv(), timeout=left))
            except TimeoutError:
                return
            if message.get("type") == "job.update":
                states.append(message["job"]["state"])
                if message["job"]["state"] == JobState.COMPLETED:
                    return
    except ConnectionClosed:
        return


def drop(socket: ClientConnection) -> None:
    """Abort the TCP connection: no close frame, the server learns of it from the broken connection only."""
    socket.transport.abort()


async def watch(drill: harness.Drill, job: Job) -> tuple[LogViewer, list[str], list[str]]:
    """The viewer's session: read, drop both sockets, wait, reconnect, read to the end."""
    viewer = LogViewer()
    states_before: list[str] = []
    states_after: list[str] = []
    log_socket = await open_socket(drill, f"/ws/jobs/{job.pk}/log/")
    state_socket = await open_socket(drill, f"/ws/jobs/{job.pk}/")
    await asyncio.gather(
        read_log(log_socket, viewer, seconds=READ_BEFORE_DROP_SECONDS),
        read_states(state_socket, states_before, seconds=READ_BEFORE_DROP_SECONDS),
    )
    drop(log_socket)
    drop(state_socket)
    drill.say(
        f"both sockets aborted (TCP, no close frame) after {viewer.chunks} chunks: holding stdout "
        f"{viewer.offset('stdout')} B, stderr {viewer.offset('stderr')} B; states seen {states_before}"
    )
    await asyncio.sleep(DROPPED_SECONDS)
    size = Path(job.stdout_path).stat().st_size
    drill.say(f"{DROPPED_SECONDS} s later the stdout file holds {size} B; reconnecting with {query(viewer)}")
    log_socket = await open_socket(drill, f"/ws/jobs/{job.pk}/log/{query(viewer)}")
    state_socket = await open_socket(drill, f"/ws/jobs/{job.pk}/")
    await asyncio.gather(
        read_log(log_socket, viewer, seconds=END_TIMEOUT_SECONDS),
        read_states(state_socket, states_after, seconds=END_TIMEOUT_SECONDS),
    )
    await log_socket.close()
    await state_socket.close()
    return viewer, states_before, states_after


def compare(drill: harness.Drill, job: Job, viewer: LogViewer) -> bool:
    """The bytes received against the files, and the numbered lines against what the script printed."""
    passed = not viewer.problems
    for problem in viewer.problems:
        drill.say(f"FAILED: {problem}")
    if viewer.ended is None:
        drill.say("FAILED: no log.end arrived")
        passed = False
    for stream, path in (("stdout", job.stdout_path), ("stderr", job.stderr_path)):
        on_disk = Path(path).read_bytes()
        same = bytes(viewer.received[stream]) == on_disk
        drill.say(
            f"{stream}: received {len(viewer.received[stream])} B, file {len(on_disk)} B: "
            f"{'identical' if same else 'DIFFERENT'}"
        )
        passed = passed and same
    numbers = [int(line.split()[1]) for line in viewer.received["stdout"].decode().splitlines()]
    in_order = numbers == list(range(1, LINES + 1))
    drill.say(f"stdout lines: {len(numbers)} received, numbered 1..{LINES} once each in order: {in_order}")
    return passed and in_order


def run(drill: harness.Drill) -> bool:
    burst = Burst.start(drill, count=1, script=SCRIPT, time_limit_minutes=3)
    burst.wait()
    job_id = burst.submissions[0].job_id
    if job_id is None:
        drill.say("FAILED: the job was not accepted")
        return False
    running = harness.wait_for(
        lambda: (
            Job.objects.get(pk=job_id).state == JobState.RUNNING
            and Path(Job.objects.get(pk=job_id).stdout_path).exists()
        ),
        timeout_seconds=60,
    )
    job = Job.objects.get(pk=job_id)
    drill.say(f"job {job_id[:8]} {'is running' if running else 'did NOT start'}: Slurm job {job.slurm_job_id}")
    viewer, states_before, states_after = asyncio.run(watch(drill, job))
    drill.say(f"after the reconnect: log.end {viewer.ended}; states seen {states_after}")
    passed = compare(drill, job, viewer)
    states_ok = bool(states_after) and states_after[-1] == JobState.COMPLETED
    drill.say(f"state socket: before the drop {states_before}, after {states_after}: ends completed: {states_ok}")
    return ledger_check(drill, burst.submissions) and passed and states_ok


if __name__ == "__main__":
    harness.main("websocket", "a viewer's WebSockets dropped and reconnected while the log grows", run)
