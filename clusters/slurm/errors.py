"""Typed errors of the Slurm client: retryable (try again later) versus terminal (retrying cannot help)."""

from __future__ import annotations

from clusters.slurm.types import SlurmMessage


class SlurmError(Exception):
    """Any failure talking to slurmrestd; `messages` are Slurm's own words when it gave any."""

    retryable: bool = False

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


class SlurmUnavailable(SlurmRetryableError):
    """slurmrestd could not be reached at all (connection refused, DNS, reset)."""


class SlurmTimeout(SlurmRetryableError):
    """slurmrestd did not answer within the client's timeout."""


class SlurmServerError(SlurmRetryableError):
    """slurmrestd answered 5xx without a terminal Slurm error code, or slurmctld/slurmdbd is unreachable behind it."""


class SlurmTerminalError(SlurmError):
    """Slurm understood the request and refused it; sending it again will be refused again."""


class SlurmRejected(SlurmTerminalError):
    """Slurm rejected the request (invalid job, impossible resources, permission denied on an object)."""


class SlurmAuthError(SlurmTerminalError):
    """The token was missing, expired or invalid, or the user may not do this at all."""


class SlurmNotFound(SlurmTerminalError):
    """The job, node, account or API version does not exist."""
