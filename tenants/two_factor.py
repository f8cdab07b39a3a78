"""Two-factor sign-in for local accounts: a TOTP authenticator (an app's six-digit codes), through allauth.mfa.

Anyone with a portal password may turn it on; PORTAL_MFA_REQUIRED_FOR_STAFF makes staff who sign in with a
password set it up before they can do anything else. People who sign in through an OpenID provider are left to
the provider's own second factor. The secret is stored by allauth.mfa (its Authenticator model); the codes are
checked with its TOTP helpers, each code usable once.
"""

from __future__ import annotations

from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import TOTP
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import transaction

from tenants.services import audit_record

TWO_FACTOR_TOKENS = (
    "This account signs in with two factors, so a password alone cannot create tokens: sign in to the portal in a "
    "browser and create one on the API tokens page."
)


def totp_authenticator(user: User | AnonymousUser | AbstractBaseUser) -> Authenticator | None:
    if not user.is_authenticated:
        return None
    return Authenticator.objects.filter(user_id=user.pk, type=Authenticator.Type.TOTP).first()


def totp_enabled(user: User | AnonymousUser | AbstractBaseUser) -> bool:
    return totp_authenticator(user) is not None


def totp_required(user: User | AnonymousUser | AbstractBaseUser) -> bool:
    """Whether this person must have two-factor sign-in to use the portal after a password sign-in."""
    return bool(settings.PORTAL_MFA_REQUIRED_FOR_STAFF and user.is_authenticated and getattr(user, "is_staff", False))


def totp_code_check(*, user: User, code: str) -> bool:
    """The code from the user's authenticator app is right now and has not been used before."""
    authenticator = totp_authenticator(user)
    return authenticator is not None and TOTP(authenticator).validate_code(code.strip())


class TwoFactorRefused(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


@transaction.atomic
def totp_enable(*, user: User, secret: str, code: str) -> Authenticator:
    """Turn two-factor sign-in on with `secret` (shown to the user once), proven by a code their app made from it."""
    User.objects.select_for_update(of=("self",)).filter(pk=user.pk).first()
    if totp_enabled(user):
        raise TwoFactorRefused("Two-factor sign-in is already on for your account.")
    authenticator = TOTP.activate(user, secret).instance
    # Checked through the new authenticator, so that this code counts as used and cannot sign in as well.
    if not TOTP(authenticator).validate_code(code.strip()):
        raise TwoFactorRefused(
            "That code does not match: type the six digits your authenticator app shows now for this portal."
        )
    audit_record(
        actor=user, action="user.two_factor_enabled", target=user, tenant=None, before=None, after={"type": "totp"}
    )
    return authenticator


@transaction.atomic
def totp_disable(*, user: User) -> None:
    if totp_required(user):
        raise TwoFactorRefused("This portal requires two-factor sign-in for staff: it cannot be turned off.")
    deleted, _ = Authenticator.objects.filter(user_id=user.pk, type=Authenticator.Type.TOTP).delete()
    if deleted:
        audit_record(
            actor=user, action="user.two_factor_disabled", target=user, tenant=None, before={"type": "totp"}, after=None
        )
