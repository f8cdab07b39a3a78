"""The rules of the isolation matrix (tests/tenants/test_isolation_matrix.py): the roles every route is tried
with, and the shorthands for the statuses each must get. Browser pages add their entries in
tests/frontend/page_matrix.py and the files it gathers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLES = ("anonymous", "outsider", "tenant_member", "viewer", "member", "manager", "tenant_admin", "staff")
INSIDERS = ("tenant_member", "viewer", "member", "manager", "tenant_admin", "staff")

TENANT_ADMINS = ("tenant_admin", "staff")
PROJECT_VIEWERS = ("viewer", "member", "manager", "tenant_admin", "staff")
PROJECT_MANAGERS = ("manager", "tenant_admin", "staff")
# Submitting needs a project role with a Slurm association (or portal admin), and a username on the cluster.
SUBMITTERS = ("member", "manager", "staff")

Expected = dict[str, int]


def only(
    allowed: int, roles: tuple[str, ...], denied: int = 403, outsider: int = 404, anonymous: int = 401
) -> Expected:
    """`allowed` for `roles`, 401 for anonymous, 404 for the outsider, `denied` for every other insider."""
    statuses = {role: denied for role in INSIDERS}
    statuses.update({role: allowed for role in roles})
    return {"anonymous": anonymous, "outsider": outsider, **statuses}


def everyone(status: int, anonymous: int = 401) -> Expected:
    return {role: status for role in ROLES} | {"anonymous": anonymous}


def page_only(allowed: int, roles: tuple[str, ...], denied: int = 403, outsider: int = 404) -> Expected:
    """A browser page: like `only`, but anonymous visitors are sent to the login page (302)."""
    return only(allowed, roles, denied=denied, outsider=outsider, anonymous=302)


def page_everyone(status: int = 200) -> Expected:
    """A browser page every signed-in user may open; anonymous visitors are sent to the login page."""
    return everyone(status, anonymous=302)


@dataclass(frozen=True)
class Case:
    expected: Expected
    # The request body, built from the matrix's World; sent as JSON, or as a browser form when `form` is set.
    body: Callable[[Any], dict[str, Any]] | None = None
    # Roles that must get an empty list (a list that shows nothing of the tenant).
    leak_free_for: tuple[str, ...] = ("outsider",)
    form: bool = False
