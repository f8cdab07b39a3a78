"""Minting short-lived slurmrestd tokens (HS256 JWT) from a cluster's key file.

Whoever holds the key can act as any user on the cluster, root included, so only Celery workers
construct a TokenMinter; the web tier never reads the key.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import jwt

from clusters.slurm.errors import SlurmAuthError

# Reuse a token until this fraction of its life is gone, so a request never carries an almost-expired one.
_REUSE_FRACTION = 0.5


class TokenMinter:
    def __init__(self, *, key_file: str | Path, lifespan_seconds: int = 300) -> None:
        if lifespan_seconds < 10:
            raise ValueError("a token must live at least 10 seconds")
        self.key_file = Path(key_file)
        self.lifespan_seconds = lifespan_seconds
        self._key: bytes | None = None
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def _load_key(self) -> bytes:
        if self._key is None:
            try:
                key = self.key_file.read_bytes()
            except OSError as exc:
                raise SlurmAuthError(f"cannot read the cluster's JWT key file {self.key_file}: {exc.strerror}") from exc
            if len(key) < 16:
                raise SlurmAuthError(f"the JWT key file {self.key_file} holds {len(key)} bytes; Slurm needs 32")
            self._key = key
        return self._key

    def mint(self, username: str, *, lifespan_seconds: int | None = None, issued_at: int | None = None) -> str:
        """A new token for `username`; `issued_at` lets tests make one that is already expired."""
        now = int(time.time()) if issued_at is None else issued_at
        lifespan = self.lifespan_seconds if lifespan_seconds is None else lifespan_seconds
        claims = {"sun": username, "iat": now, "exp": now + lifespan}
        return jwt.encode(claims, self._load_key(), algorithm="HS256")

    def token_for(self, username: str) -> str:
        """A cached token for `username`, renewed once half its life has passed."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(username)
            if cached and cached[1] > now:
                return cached[0]
            token = self.mint(username)
            self._cache[username] = (token, now + self.lifespan_seconds * _REUSE_FRACTION)
            return token
