"""Hostile job input on the real stack: shell metacharacters in names, scripts and environment values reach
Slurm and the job byte for byte, through the API, a real Celery worker and slurmrestd, and nothing in them runs."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from clusters.clients import slurm_client_for
from jobs.models import JobState
from tenants.services import token_create
from tests.jobs.conftest import LiveProject
from tests.websockets import handshake

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

# Each variable is printed by the job as `NAME=<base64 of its value>`; base64 carries any byte unharmed.
DUMP_LINE = "dump"


def _tricky_values(marker: str) -> dict[str, str]:
    """Environment values that a shell, a `%` pattern or a careless encoder would change or run."""
    return {
        "TRICKY_SUBSTITUTION": f"$(touch {marker}) `touch {marker}` ${{HOME}} $HOME",
        "TRICKY_METACHARACTERS": ";|&><*?~!#  'single'  \"double\"  \\back\\slash\\ ",
        "TRICKY_NEWLINES": "first line\nsecond line\n\ttabbed\n",
        "TRICKY_PERCENT": "%j %u %x %A %% 100%",
        "TRICKY_UNICODE": "ünïcödé ✓ 日本語 😀",
        "TRICKY_DASHES": "--export=NONE -e --wrap='id'",
        "TRICKY_EQUALS": "a=b=c==",
    }


def _tricky_name(marker: str) -> str:
    return f"-x $(touch {marker}) `id`;|&><*?~!# 'q' \"dq\" \\ %j %x %u ${{HOME}} ünï ✓"


def _tricky_script(marker: str, variables: list[str]) -> str:
    """A script that reports its own bytes, its name as Slurm gave it and each variable, all in base64.

    Its comments and quoted strings hold substitutions too: only the shell that runs the job reads them,
    and there they are inert text.
    """
    dumps = "\n".join(
        f"printf '{DUMP_LINE} {name} %s\\n' \"$(printf '%s' \"${name}\" | base64 -w0)\"" for name in variables
    )
    return (
        "#!/bin/bash\n"
        f"# $(touch {marker}) `touch {marker}` ;|&><*?~!# ${{HOME}} %j %x ünï ✓ \\ 'q' \"dq\"\n"
        f"echo '$(touch {marker})' > /dev/null\n"
        f'printf \'{DUMP_LINE} SCRIPT %s\\n\' "$(base64 -w0 "$0")"\n'
        f"printf '{DUMP_LINE} SLURM_JOB_NAME %s\\n' \"$(printf '%s' \"$SLURM_JOB_NAME\" | base64 -w0)\"\n"
        f"{dumps}\n"
    )


def _dumped(stdout: bytes) -> dict[str, bytes]:
    lines = [line.split(" ", 2) for line in stdout.decode().splitlines() if line.startswith(DUMP_LINE + " ")]
    return {name: base64.b64decode(value) for _, name, value in lines}


def test_metacharacters_reach_slurm_and_the_job_verbatim_and_nothing_runs(
    live_project: LiveProject, celery_worker: str
) -> None:
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    values = _tricky_values(marker)
    name = _tricky_name(marker)
    script = _tricky_script(marker, sorted(values))

    reply = live_project.submit(name=name, script=script, environment=values)
    assert reply["name"] == name
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)

    assert job.state == JobState.COMPLETED, (job.state, job.last_error, job.state_reason)
    assert job.name == name
    assert job.slurm_job_id is not None
    assert slurm_client_for(job.cluster).get_job(job_id=job.slurm_job_id).name == name
    dumped = _dumped(Path(job.stdout_path).read_bytes())
    assert dumped["SCRIPT"] == script.encode()
    assert dumped["SLURM_JOB_NAME"] == name.encode()
    assert {key: dumped[key] for key in values} == {key: value.encode() for key, value in values.items()}
    assert Path(job.stderr_path).read_bytes() == b""
    assert not Path(marker).exists()


# Run in the job's directory (its working directory), as its user: Slurm has opened the files already, the
# links replace their names. The portal runs as root here, so following them would read the host's secrets.
LINKING_SCRIPT = """#!/bin/bash
echo "output before the links"
ln -sf /etc/shadow stdout.log
ln -sf /etc/passwd stderr.log
"""


def test_a_job_that_links_its_output_to_host_secrets_gets_them_served_nowhere(
    live_project: LiveProject, celery_worker: str
) -> None:
    reply = live_project.submit(name="linker", script=LINKING_SCRIPT)
    job = live_project.wait_for(reply["id"], lambda job: job.is_final)
    assert job.state == JobState.COMPLETED, (job.state, job.last_error)
    assert Path(job.stdout_path).is_symlink()
    _, secret = token_create(user=live_project.member, name="linker")

    for stream in ("stdout", "stderr"):
        response = live_project.api.get(f"/api/v1/jobs/{job.pk}/log/?stream={stream}")
        assert response.status_code == 403
        assert set(response.json()) == {"code", "message", "fields"}
        assert b"root:" not in response.content

    async def live_log() -> list[dict[str, Any]]:
        from portal.asgi import application

        headers = [(b"authorization", f"Bearer {secret}".encode())]
        socket = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/log/", headers=headers)
        connected, _ = await handshake(socket, timeout=10)
        assert connected
        messages: list[dict[str, Any]] = []
        while not messages or messages[-1]["type"] != "log.end":
            messages.append(await socket.receive_json_from(timeout=10))
        await socket.disconnect()
        return messages

    messages = async_to_sync(live_log)()
    assert [(message["type"], message.get("stream")) for message in messages] == [
        ("log.error", "stdout"),
        ("log.error", "stderr"),
        ("log.end", None),
    ]
    assert "root:" not in repr(messages)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "two\nlines", "Remove control characters (such as new lines or tabs) from the name."),
        ("name", "tab\there", "Remove control characters (such as new lines or tabs) from the name."),
        ("name", "nul\x00byte", "Null characters are not allowed."),
        ("script", "#!/bin/bash\necho \x00\n", "Null characters are not allowed."),
    ],
)
def test_what_slurm_cannot_carry_is_refused_before_it_gets_there(
    live_project: LiveProject, field: str, value: str, message: str
) -> None:
    body = {
        "project": live_project.label,
        "cluster": "local",
        "partition": "h100",
        "gpus": 1,
        "script": "#!/bin/bash\necho hello\n",
        field: value,
    }

    response = live_project.api.post("/api/v1/jobs/", body, format="json")

    assert response.status_code == 400
    error = response.json()
    assert (error["code"], error["fields"]) == ("invalid", {field: [message]})
    assert not live_project.project.jobs.exists()


def test_an_environment_value_with_a_nul_byte_is_refused(live_project: LiveProject) -> None:
    body = {
        "project": live_project.label,
        "cluster": "local",
        "gpus": 1,
        "script": "#!/bin/bash\necho hello\n",
        "environment": {"BAD": "a\x00b"},
    }

    response = live_project.api.post("/api/v1/jobs/", body, format="json")

    assert response.status_code == 400
    assert response.json()["fields"] == {"environment.BAD": ["Null characters are not allowed."]}
    assert not live_project.project.jobs.exists()
