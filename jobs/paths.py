"""Where a job's output goes: a directory per job under the cluster's log root, chosen by the portal."""

from __future__ import annotations

import os
import pwd
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class JobPaths:
    working_directory: str
    stdout: str
    stderr: str


def job_paths(
    *, log_root: str, tenant_slug: str, project_slug: str, job_id: uuid.UUID, is_array: bool = False
) -> JobPaths:
    """`<log root>/<tenant>/<project>/<job id>/{stdout,stderr}.log`: slugs and a UUID, so nothing escapes the root.

    An array's tasks each write their own, `stdout-%A_%a.log` (Slurm fills in the array's job id and the task's
    index; `jobs.arrays.array_output_path` does the same to read them)."""
    directory = PurePosixPath(log_root) / tenant_slug / project_slug / str(job_id)
    suffix = "-%A_%a" if is_array else ""
    return JobPaths(
        working_directory=str(directory),
        stdout=str(directory / f"stdout{suffix}.log"),
        stderr=str(directory / f"stderr{suffix}.log"),
    )


class JobDirectoryError(Exception):
    """The job's directory cannot be made ready for its user; the message says why."""


def job_directory_prepare(*, log_root: str, working_directory: str, username: str) -> None:
    """Create the job's directory, owned by the job's user so Slurm can open its output there.

    Runs on a worker that shares the cluster's filesystem and may change owners (root or CAP_CHOWN).
    Tenant and project directories are traversable but not listable (0711), so users cannot browse
    each other's jobs. The job directory takes the log root's group with setgid (2750): the portal,
    in that group, can read the output it streams.
    """
    try:
        account = pwd.getpwnam(username)
    except KeyError:
        raise JobDirectoryError(
            f"The user '{username}' does not exist on the portal's worker host, so its output directory "
            "cannot be prepared; the host must know the cluster's users (e.g. through LDAP)."
        ) from None
    root = PurePosixPath(log_root)
    directory = PurePosixPath(working_directory)
    if root not in directory.parents:
        raise JobDirectoryError(f"{directory} is not under the cluster's log root {root}")
    try:
        group = os.stat(root).st_gid
        for parent in reversed(directory.parents):
            if parent in root.parents or parent == root:
                continue
            if not os.path.isdir(parent):
                os.makedirs(parent, exist_ok=True)
                os.chmod(parent, 0o711)  # noqa: S103 -- traversable, not listable, on purpose
        os.makedirs(directory, exist_ok=True)
        os.chown(directory, account.pw_uid, group)
        os.chmod(directory, 0o2750)  # noqa: S103 -- group read for the portal, on purpose
    except OSError as exc:
        raise JobDirectoryError(
            f"Could not prepare {directory} for '{username}': {exc.strerror or exc}. "
            f"The workers need write access to {root} and the right to change owners there."
        ) from exc
