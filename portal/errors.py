"""Domain errors that services raise and the API renders in its one error shape."""

from __future__ import annotations


class Conflict(Exception):
    """The request is well formed but the object's current state forbids it (HTTP 409): e.g. cancelling a
    job that has already ended. The message says what state it is in and what to do instead."""
