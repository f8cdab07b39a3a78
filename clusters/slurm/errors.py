"""Typed errors of the Slurm client: retryable (try again later) versus terminal (retrying cannot help)."""

from __future__ import annotations

from clusters.slurm.types import SlurmMessage


class SlurmError(Exception):
    """Any failure talking to slurmrestd; `messages` are Slurm's own words when it gave any."""

    retryable: bool = False
    kind = "error"  # what the portal's metrics call it (portal_slurmrestd_errors_total)

    def __init__(self, message: str, *, messages: tuple[SlurmMessage, ...] = (), status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.messages = messages
        self.status_code = status_code

    def __str__(self) -> str:
        return self.message


class SlurmRetryableError(SlurmError):
    """The cluster could not answer now (down, slow, overloaded); the same request may succeed later."""

    retryable = True
    kind = "retryable"


class SlurmUnavailable(SlurmRetryableError):
    """slurmrestd could not be reached at all (connection refused, DNS, reset)."""

    kind = "unavailable"


class SlurmTimeout(SlurmRetryableError):
    """slurmrestd did not answer within the client's timeout."""

    kind = "timeout"


class SlurmServerError(SlurmRetryableError):
    """slurmrestd answered 5xx without a terminal Slurm error code, or slurmctld/slurmdbd is unreachable behind it."""

    kind = "server_error"


class SlurmTerminalError(SlurmError):
    """Slurm understood the request and refused it; sending it again will be refused again."""

    kind = "terminal"


class SlurmRejected(SlurmTerminalError):
    """Slurm rejected the request (invalid job, impossible resources, permission denied on an object)."""

    kind = "rejected"


class SlurmAuthError(SlurmTerminalError):
    """The token was missing, expired or invalid, or the user may not do this at all."""

    kind = "auth"


class SlurmNotFound(SlurmTerminalError):
    """The job, node, account or API version does not exist."""

    kind = "not_found"
