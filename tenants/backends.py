"""Local passwords: Django's own check, unless the portal signs people in only through OpenID providers.

With PORTAL_LOCAL_PASSWORDS=false no password is ever checked, wherever it is sent (the login form,
`POST /api/v1/tokens/`, the Django admin's form); the pages and the API say so themselves (LOCAL_PASSWORDS_OFF).
Accounts keep their passwords, so turning the setting back on restores them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.http import HttpRequest

LOCAL_PASSWORDS_OFF = (
    "Signing in with a password is turned off on this portal: sign in through your organisation's sign-in "
    "instead. Scripts use API tokens, which you create on the API tokens page once signed in."
)


def local_passwords_enabled() -> bool:
    return bool(settings.PORTAL_LOCAL_PASSWORDS)


class LocalPasswordBackend(ModelBackend):
    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> User | None:
        if not local_passwords_enabled():
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
