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
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from portal.db import RelatedRows

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

    def get_user(self, user_id: Any) -> User | None:
        """Django's, by one prepared statement that also reads the person's chosen time zone, which every page is
        drawn in (tenants/profiles.py `user_time_zone`): the signed-in user is read on every request."""
        try:
            pk = User._meta.pk.to_python(user_id)
        except ValidationError:
            return None
        found = _USER_WITH_TIME_ZONE.fetch(_USER_BY_ID, {"user": pk})
        user = found[0] if found else None
        return user if user is not None and self.user_can_authenticate(user) else None


# A user with `profile_time_zone`: their profile's zone, or None where they never saved a profile.
_USER_WITH_TIME_ZONE = RelatedRows(
    User,
    alias="account",
    annotations=(("profile_time_zone", "(SELECT time_zone FROM tenants_userprofile WHERE user_id = account.id)"),),
)
_USER_BY_ID = f"{_USER_WITH_TIME_ZONE.select} WHERE account.id = %(user)s"
