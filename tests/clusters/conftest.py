"""Fixtures of the Slurm contract suite: one set of tests, run against every live cluster (`live`)."""

from __future__ import annotations

import os
import pwd
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusters.slurm import SlurmClient, SlurmError
from clusters.slurm.types import JobSubmission
from tests.conftest import JOB_USER, parent_account_ensure
from tests.live_clusters import LiveCluster


@pytest.fixture(scope="session")
def contract_client(live: LiveCluster) -> Iterator[SlurmClient]:
    client = SlurmClient(
        base_url=live.slurmrestd_url, key_file=live.jwt_key_file, admin_user=live.admin_user, timeout_seconds=10
    )
    try:
        client.ping()
    except SlurmError as exc:
        pytest.fail(f"cluster {live.name} is described as up but does not answer ({exc}); run `make cluster`")
    yield client
    client.close()


@pytest.fixture(scope="session")
def contract_parent_account(live: LiveCluster, contract_client: SlurmClient) -> str:
    """The parent of the tests' accounts, as a tenant's account is the parent of its projects'."""
    return parent_account_ensure(contract_client, cluster=live.name)


@pytest.fixture
def contract_account(live: LiveCluster, contract_client: SlurmClient, contract_parent_account: str) -> Iterator[str]:
    """A fresh account with alice associated; its jobs are cancelled and the account removed afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    contract_client.create_account(
        name=name,
        cluster=live.name,
        description="pytest",
        organization="pytest",
        parent_account=contract_parent_account,
    )
    contract_client.add_user_association(account=name, user=JOB_USER, cluster=live.name)
    yield name
    listing = contract_client.list_jobs()
    for job in listing.jobs if listing else ():
        if job.account == name and not job.state.is_finished:
            contract_client.cancel_job(user=contract_client.admin_user, job_id=job.job_id)
    # slurmdbd refuses to delete an account while a cancelled job is still completing: retry briefly.
    for _ in range(20):
        try:
            contract_client.remove_user_association(account=name, user=JOB_USER, cluster=live.name)
            contract_client.delete_account(name=name)
            return
        except SlurmError:
            time.sleep(0.5)


@pytest.fixture
def contract_job_directory(live: LiveCluster) -> Iterator[Path]:
    """A directory under the cluster's job output root that alice's jobs can write to."""
    path = Path(live.log_root) / "pytest" / uuid.uuid4().hex
    path.mkdir(parents=True)
    user = pwd.getpwnam(JOB_USER)
    os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def contract_submission(
    live: LiveCluster, contract_account: str, contract_job_directory: Path
) -> Callable[..., JobSubmission]:
    def make(**overrides: object) -> JobSubmission:
        values: dict[str, object] = {
            "name": "pytest-job",
            "account": contract_account,
            "partition": live.gpu_partition,
            "script": "#!/bin/bash\necho started\nsleep 2\necho done\n",
            "time_limit_minutes": 1,
            "working_directory": str(contract_job_directory),
            "standard_output": str(contract_job_directory / "stdout.txt"),
            "standard_error": str(contract_job_directory / "stderr.txt"),
            "gpus": 1,
            "gpu_type": live.gpu_type,
        }
        values.update(overrides)
        return JobSubmission(**values)  # type: ignore[arg-type]

    return make
