"""The only code that speaks HTTP to slurmrestd: a typed client, token minting, one codec per API version."""

from clusters.slurm.client import SlurmClient
from clusters.slurm.errors import (
    SlurmAuthError,
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
    SlurmRetryableError,
    SlurmServerError,
    SlurmTerminalError,
    SlurmTimeout,
    SlurmUnavailable,
)

__all__ = [
    "SlurmAuthError",
    "SlurmClient",
    "SlurmError",
    "SlurmNotFound",
    "SlurmRejected",
    "SlurmRetryableError",
    "SlurmServerError",
    "SlurmTerminalError",
    "SlurmTimeout",
    "SlurmUnavailable",
]
