"""Slurm account names for tenants and projects: derived once, stable, within Slurm's limits.

Tenant parent accounts are `t_<tenant>`; project accounts are `<tenant>_<project>`. Slugs never contain
underscores and are at least two characters long, so the two families can never collide, and a project
account never starts with `t_`. Names longer than `MAX_ACCOUNT_NAME_LENGTH` are cut and given a short
digest of the full name, which keeps them unique (the database's unique constraints check the rest).
"""

from __future__ import annotations

import hashlib

# Slurm stores account names lower-cased; 32 characters stay readable in `sacct`/`sshare` columns.
MAX_ACCOUNT_NAME_LENGTH = 32
_DIGEST_LENGTH = 6


def _fit(name: str) -> str:
    if len(name) <= MAX_ACCOUNT_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_DIGEST_LENGTH]
    return f"{name[: MAX_ACCOUNT_NAME_LENGTH - _DIGEST_LENGTH - 1]}-{digest}"


def tenant_parent_account_name(tenant_slug: str) -> str:
    return _fit(f"t_{tenant_slug}")


def project_account_name(tenant_slug: str, project_slug: str) -> str:
    return _fit(f"{tenant_slug}_{project_slug}")
