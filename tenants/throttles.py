"""Rate limits against guessing: passwords (the browser's login form and `POST /api/v1/tokens/`) and API tokens.

Each counts per client address in the cache (Redis in production) with DRF's sliding window, the address
taken the way DRF's throttles take it (`PORTAL_NUM_PROXIES`, so a forged X-Forwarded-For buys nothing).
Rates come from REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] and are read when a throttle is made, so a
changed setting applies at once:

- `login` (API_LOGIN_THROTTLE_RATE): failed password attempts, at the login form and the token endpoint in the
  same window (switching between them buys no extra guesses). Right passwords never count: a whole campus
  behind one NAT address signs in every morning.
- Per account and address (`AccountBackoff`): after LOGIN_ACCOUNT_FREE_FAILURES failed passwords for one username
  from one address, that pair waits before each further attempt, twice as long each time. Keyed on both, so
  a stranger guessing someone's password elsewhere never locks the owner out.
- `token_guess` (API_TOKEN_GUESS_THROTTLE_RATE): unknown, expired or revoked bearer tokens, over REST and
  WebSocket handshakes. Once over the limit, the address gets 429 for any token, right or wrong, until the
  window has room again (else a right guess would still stand out); tokens used from other addresses keep
  working.

Two requests of one address at the same moment may both pass the last free place of a window, as with DRF's
own throttles: the limits bound guessing speed, they are not exact counters.

While the cache is unreachable (Redis restarting) the limits are not enforced, with a warning in the log:
passwords and tokens are still checked against the database, and every API request failing with 500 for as
long as Redis is away would be the worse outage.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from types import SimpleNamespace
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

logger = logging.getLogger(__name__)
CACHE_UNREACHABLE = "rate limits not enforced: the cache is unreachable"

# DRF's key for a scope's window, so that DRF's throttles and ours can count in the same one.
CACHE_KEY_FORMAT = "throttle_%(scope)s_%(ident)s"
_PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def client_address(*, remote_addr: str | None, forwarded_for: str | None) -> str | None:
    """The client's address as DRF's throttles see it, for requests and WebSocket handshakes alike."""
    headers = {"x-forwarded-for": forwarded_for} if forwarded_for is not None else {}
    shim = SimpleNamespace(headers=headers, META={"REMOTE_ADDR": remote_addr})
    return cast(str | None, BaseThrottle().get_ident(cast(Any, shim)))


def request_address(request: Any) -> str | None:
    """The address of a Django or DRF request."""
    return client_address(
        remote_addr=request.META.get("REMOTE_ADDR"), forwarded_for=request.headers.get("x-forwarded-for")
    )


def current_rate(scope: str) -> str | None:
    """The scope's rate in the settings in force now (DRF's throttles read them once, at import)."""
    return cast(str | None, api_settings.DEFAULT_THROTTLE_RATES.get(scope))


class FailureThrottle:
    """Counts failures only, per client address, in the same list of times DRF's throttles keep."""

    scope = ""

    def __init__(self) -> None:
        rate = current_rate(self.scope)
        self.limit: int | None = None
        self.window_seconds = 0
        if rate:
            count, period = rate.split("/")
            self.limit, self.window_seconds = int(count), _PERIOD_SECONDS[period[0]]

    def blocked_for(self, address: str | None) -> int | None:
        """Seconds until `address` may try again; None while it is under the limit."""
        if self.limit is None or address is None:
            return None
        now = time.time()
        try:
            recent = self._recent(address, now)
        except Exception:  # the cache backend's own errors (redis-py's for Redis)
            logger.warning(CACHE_UNREACHABLE, exc_info=True)
            return None
        if len(recent) < self.limit:
            return None
        # The window has room again when the oldest failure that fills it leaves it.
        frees_at = recent[self.limit - 1] + self.window_seconds
        return max(1, math.ceil(frees_at - now))

    def record_failure(self, address: str | None) -> None:
        if self.limit is None or address is None:
            return
        now = time.time()
        try:
            cache.set(self._key(address), [now, *self._recent(address, now)], self.window_seconds)
        except Exception:  # the cache backend's own errors (redis-py's for Redis)
            logger.warning(CACHE_UNREACHABLE, exc_info=True)

    def _recent(self, address: str, now: float) -> list[float]:
        """The failures still in the window, newest first."""
        history: list[float] = cache.get(self._key(address), [])
        return [moment for moment in history if moment > now - self.window_seconds]

    def _key(self, address: str) -> str:
        return CACHE_KEY_FORMAT % {"scope": self.scope, "ident": address}


class LoginFailureThrottle(FailureThrottle):
    """Failed passwords per client address, at the login form and `POST /api/v1/tokens/` together."""

    scope = "login"


# The first wait of a username at one address, the longest, and how long its failures are remembered. How
# many it may have before waiting is the setting LOGIN_ACCOUNT_FREE_FAILURES (API_LOGIN_ACCOUNT_FREE_FAILURES).
ACCOUNT_FIRST_WAIT_SECONDS = 30
ACCOUNT_MAX_WAIT_SECONDS = 15 * 60
ACCOUNT_MEMORY_SECONDS = 3600


class AccountBackoff:
    """Failed passwords for one username from one address over the last hour: beyond LOGIN_ACCOUNT_FREE_FAILURES
    (5), each one makes the pair wait, twice as long as the one before (30 s, 1 min, 2 min, ... at most 15 min)."""

    def blocked_for(self, address: str | None, username: str) -> int | None:
        """Seconds until this username may be tried again from `address`; None when it may be now."""
        if address is None or not username:
            return None
        now = time.time()
        try:
            failures = self._recent(address, username, now)
        except Exception:  # the cache backend's own errors (redis-py's for Redis)
            logger.warning(CACHE_UNREACHABLE, exc_info=True)
            return None
        beyond = len(failures) - settings.LOGIN_ACCOUNT_FREE_FAILURES
        if beyond < 0:
            return None
        wait = min(ACCOUNT_FIRST_WAIT_SECONDS * 2**beyond, ACCOUNT_MAX_WAIT_SECONDS)
        left = failures[0] + wait - now
        return math.ceil(left) if left > 0 else None

    def record_failure(self, address: str | None, username: str) -> None:
        if address is None or not username:
            return
        now = time.time()
        try:
            failures = [now, *self._recent(address, username, now)]
            cache.set(self._key(address, username), failures, ACCOUNT_MEMORY_SECONDS)
        except Exception:  # the cache backend's own errors (redis-py's for Redis)
            logger.warning(CACHE_UNREACHABLE, exc_info=True)

    def _recent(self, address: str, username: str, now: float) -> list[float]:
        """The failures of the last hour, newest first."""
        history: list[float] = cache.get(self._key(address, username), [])
        return [moment for moment in history if moment > now - ACCOUNT_MEMORY_SECONDS]

    def _key(self, address: str, username: str) -> str:
        digest = hashlib.sha256(f"{username.casefold()}\0{address}".encode()).hexdigest()
        return CACHE_KEY_FORMAT % {"scope": "login_account", "ident": digest}


def password_attempt_wait(*, address: str | None, username: str) -> int | None:
    """Seconds before a password may be tried for `username` from `address` (the longer of the address's and
    the pair's waits), or None when it may be tried now. Check before checking the password."""
    waits = [
        wait
        for wait in (LoginFailureThrottle().blocked_for(address), AccountBackoff().blocked_for(address, username))
        if wait is not None
    ]
    return max(waits) if waits else None


def password_failure_record(*, address: str | None, username: str) -> None:
    """Count a wrong password against the address and against the username from that address."""
    LoginFailureThrottle().record_failure(address)
    AccountBackoff().record_failure(address, username)


class PasswordGuessingThrottled(Throttled):
    default_code = "throttled"

    def __init__(self, wait: int) -> None:
        super().__init__(
            wait=wait,
            detail=(
                "Too many wrong passwords came from your address, or for this account from it; try again once "
                "the wait is over (a portal admin can reset a forgotten password)."
            ),
        )


class TokenGuessThrottle(FailureThrottle):
    """Unknown, expired or revoked bearer tokens."""

    scope = "token_guess"


class TokenGuessingThrottled(Throttled):
    default_code = "throttled"

    def __init__(self, wait: int) -> None:
        super().__init__(
            wait=wait,
            detail=(
                "Too many requests with unknown, expired or revoked tokens came from your address; "
                "send a valid token from POST /api/v1/tokens/ once the wait is over."
            ),
        )
