"""Exit codes read as the shell reports them (`$?`), from every shape each slurmrestd version gives them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from clusters.slurm.codecs import SUPPORTED_VERSIONS_NEWEST_FIRST, codec_for
from clusters.slurm.codecs.base import shell_exit_code
from clusters.slurm.types import JobState

DATA_PARSER_VERSIONS = tuple(version for version in SUPPORTED_VERSIONS_NEWEST_FIRST if version != "0.0.38")

_DEFAULT_SHARED_DIR = Path(__file__).resolve().parents[2].parent / "shared"
RECORDED_DIR = Path(os.environ.get("PORTAL_SHARED_DIR") or _DEFAULT_SHARED_DIR) / "slurmrestd-recorded"


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


_UNSET = {"set": False, "infinite": False, "number": 0}

# As Slurm 24.11.5 (v0.0.40) and 26.05.5 (v0.0.45) answered here for `exit 0`, `exit 3` and `kill -KILL $$`.
DATA_PARSER_SUCCESS = {"status": ["SUCCESS"], "return_code": _number(0), "signal": {"id": _UNSET, "name": ""}}
DATA_PARSER_EXIT_3 = {"status": ["ERROR"], "return_code": _number(3), "signal": {"id": _UNSET, "name": ""}}
DATA_PARSER_KILLED = {"status": ["SIGNALED"], "return_code": _UNSET, "signal": {"id": _number(9), "name": "KILL"}}
# As Slurm 22.05.8's dbv0.0.38 answered here.
DB_V0038_SUCCESS = {"status": "SUCCESS", "return_code": 0}
DB_V0038_KILLED = {"status": "SIGNALED", "return_code": None, "signal": {"signal_id": 9, "name": "Killed"}}


# The rule ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_status", "expected"),
    [
        (0, 0),
        (768, 3),  # `exit 3`: the return code is the second byte
        (256, 1),
        (9, 137),  # SIGKILL
        (15, 143),  # SIGTERM: scancel, or the time limit
        (139, 139),  # SIGSEGV (11) with the core-dump bit
        (0x137F, None),  # stopped by SIGSTOP: not an end
        (0xFFFFFFFE, None),  # NO_VAL: no result yet
        (None, None),
    ],
)
def test_raw_wait_status_of_v0_0_38(wait_status: int | None, expected: int | None) -> None:
    assert shell_exit_code(wait_status) == expected


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [
        (DATA_PARSER_SUCCESS, 0),
        (DATA_PARSER_EXIT_3, 3),
        (DATA_PARSER_KILLED, 137),
        # Plain numbers where a struct is expected are read the same.
        ({"status": ["ERROR"], "return_code": 3, "signal": {"id": 0, "name": ""}}, 3),
        ({"status": ["SIGNALED"], "return_code": 0, "signal": {"id": 9, "name": "KILL"}}, 137),
        # A signal id is enough even where the status does not say SIGNALED (a core dump adds a flag).
        ({"status": ["SIGNALED", "CORE_DUMPED"], "return_code": _UNSET, "signal": {"id": _number(11)}}, 139),
        ({"status": ["CORE_DUMPED"], "return_code": _UNSET, "signal": {"id": _number(6), "name": "ABRT"}}, 134),
        # Signalled without saying by what: no number can be given.
        ({"status": ["SIGNALED"], "return_code": _UNSET, "signal": {"id": _UNSET, "name": ""}}, None),
        ({"status": ["PENDING"], "return_code": _UNSET, "signal": {"id": _UNSET, "name": ""}}, None),
        (DB_V0038_SUCCESS, 0),
        ({"status": "ERROR", "return_code": 3}, 3),
        (DB_V0038_KILLED, 137),
        ({"status": "PENDING"}, None),
    ],
)
def test_exit_code_structs(exit_code: dict[str, Any], expected: int | None) -> None:
    assert shell_exit_code(exit_code) == expected


# Through each version's codec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "wait_status", "expected"),
    [
        ("COMPLETED", 0, 0),
        ("FAILED", 768, 3),
        ("FAILED", 9, 137),
        ("CANCELLED", 15, 143),
        ("RUNNING", 0, None),  # no result yet
    ],
)
def test_v0_0_38_job_info(state: str, wait_status: int, expected: int | None) -> None:
    body = {"jobs": [{"job_id": 3, "job_state": state, "exit_code": wait_status, "nodes": "gpu01"}]}

    (job,) = codec_for("0.0.38").decode_jobs(body).jobs

    assert job.exit_code == expected


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        ("COMPLETED", DB_V0038_SUCCESS, 0),
        ("FAILED", DB_V0038_KILLED, 137),
        # 22.05 writes `exit 3` as SUCCESS/0 (sacct shows 3:0): the code is lost, not 0.
        ("FAILED", DB_V0038_SUCCESS, None),
        ("FAILED", {"status": "ERROR", "return_code": 3}, 3),
    ],
)
def test_v0_0_38_accounting(state: str, exit_code: dict[str, Any], expected: int | None) -> None:
    body = {"jobs": [{"job_id": 3, "state": {"current": state}, "exit_code": exit_code}]}

    (record,) = codec_for("0.0.38").decode_accounting_jobs(body)

    assert record.exit_code == expected


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        ("COMPLETED", DATA_PARSER_SUCCESS, 0),
        ("FAILED", DATA_PARSER_EXIT_3, 3),
        ("FAILED", DATA_PARSER_KILLED, 137),
        ("RUNNING", DATA_PARSER_SUCCESS, None),
    ],
)
@pytest.mark.parametrize("version", DATA_PARSER_VERSIONS)
def test_data_parser_job_info_and_accounting(
    version: str, state: str, exit_code: dict[str, Any], expected: int | None
) -> None:
    codec = codec_for(version)
    job = {"job_id": 3, "job_state": [state], "exit_code": exit_code, "nodes": "gpu01"}
    record = {"job_id": 3, "state": {"current": [state]}, "exit_code": exit_code}

    (decoded_job,) = codec.decode_jobs({"jobs": [job]}).jobs
    (decoded_record,) = codec.decode_accounting_jobs({"jobs": [record]})

    assert (decoded_job.exit_code, decoded_record.exit_code) == (expected, expected)


# Recorded replies ------------------------------------------------------------------------------------


def _recorded(relative: str) -> dict[str, Any]:
    if not RECORDED_DIR.is_dir():
        pytest.skip(f"no recorded slurmrestd replies at {RECORDED_DIR}")
    body: dict[str, Any] = json.loads((RECORDED_DIR / f"{relative}.json").read_text())
    return body


def _recorded_prefixes() -> list[Any]:
    """ "25.11/0.0.44" for each recorded Slurm release and API version; one skipped entry without recordings."""
    prefixes = sorted(f"{path.parent.name}/{path.name}" for path in RECORDED_DIR.glob("*/0.0.4[0-9]") if path.is_dir())
    skipped = pytest.param("", marks=pytest.mark.skip(reason=f"no recorded slurmrestd replies at {RECORDED_DIR}"))
    return prefixes or [skipped]


@pytest.mark.parametrize("prefix", _recorded_prefixes())
def test_recorded_exit_codes(prefix: str) -> None:
    codec = codec_for(prefix.split("/")[1])

    def only_job(name: str) -> int | None:
        (job,) = codec.decode_jobs(_recorded(f"{prefix}/{name}")).jobs
        return job.exit_code

    assert only_job("slurm-job-completed") == 0
    assert only_job("slurm-job-failed") == 1  # `exit 1`
    assert only_job("slurm-job-timeout") == 143  # SIGTERM at the time limit
    # slurmdbd's own record of a time-limited job says SUCCESS/0; the signal sits on its batch step.
    (record,) = codec.decode_accounting_jobs(_recorded(f"{prefix}/slurmdb-job-timeout"))
    assert record.exit_code == 0


def test_every_recorded_signal_and_error_reads_as_the_shell_says() -> None:
    """Every finished job in every recorded reply whose exit_code says ERROR or SIGNALED."""
    if not RECORDED_DIR.is_dir():
        pytest.skip(f"no recorded slurmrestd replies at {RECORDED_DIR}")
    checked: dict[int, int] = {}
    for path in sorted(RECORDED_DIR.glob("*/0.0.4[0-9]/*.json")):
        body = json.loads(path.read_text())
        raw_jobs = [job for job in body.get("jobs") or [] if isinstance(job, dict)] if isinstance(body, dict) else []
        if not raw_jobs or path.stem.startswith("slurm-jwt"):
            continue
        codec = codec_for(path.parent.name)
        if path.stem.startswith("slurmdb-"):
            decoded = [record.exit_code for record in codec.decode_accounting_jobs(body)]
            states = [JobState.parse(job["state"]["current"]) for job in raw_jobs]
        else:
            decoded = [job.exit_code for job in codec.decode_jobs(body).jobs]
            states = [JobState.parse(job["job_state"]) for job in raw_jobs]
        for raw, state, exit_code in zip(raw_jobs, states, decoded, strict=True):
            status = raw["exit_code"]["status"]
            if not state.is_finished or status == ["SUCCESS"]:
                continue
            if status == ["SIGNALED"]:
                expected = 128 + raw["exit_code"]["signal"]["id"]["number"]
            else:
                assert status == ["ERROR"]
                expected = raw["exit_code"]["return_code"]["number"]
            assert (path.relative_to(RECORDED_DIR).as_posix(), raw["job_id"], exit_code) == (
                path.relative_to(RECORDED_DIR).as_posix(),
                raw["job_id"],
                expected,
            )
            checked[expected] = checked.get(expected, 0) + 1
    # The recordings hold `exit 1` jobs and SIGTERM-ed (time limit, scancel) ones, nothing else.
    assert set(checked) == {1, 143}
    assert min(checked.values()) >= 10
