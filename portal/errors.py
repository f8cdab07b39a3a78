"""Domain errors that services raise and the API renders in its one error shape."""

from __future__ import annotations


class Conflict(Exception):
    """The request is well formed but the object's current state forbids it (HTTP 409): e.g. cancelling a
    job that has already ended. The message says what state it is in and what to do instead.

    `code` names the kind of conflict in the API's error body (`conflict` unless a caller needs to tell
    them apart, e.g. `quota_exceeded`)."""

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message)
        self.code = code
