"""Single sign-on through the OpenID providers of PORTAL_OIDC_PROVIDERS, and the accounts it makes.

django-allauth's `openid_connect` provider does the protocol: the authorization code flow with PKCE (S256), a
state kept in the session and used once, the code exchanged at the provider's token endpoint, the ID token's
issuer, audience and expiry checked. The portal's provider class adds what it leaves out: a nonce, sent with
each sign-in and required back in the ID token, and the ID token's signature checked against the provider's
published keys (JWKS) always, where allauth skips it for tokens fetched from the token endpoint. Every refusal
ends on one page that says what was wrong, and nobody is signed in.

A first sign-in makes the portal account just in time (username from `preferred_username`, e-mail and names
from the provider) with an audit event in the same transaction. A username that already belongs to a portal
account is connected to it only where the provider is trusted for that (`connect_existing_users`); otherwise
the sign-in is refused with what to do. Each sign-in, the first included, then applies the provider's directory
(tenants/directory.py: roles from the groups, POSIX users from the claims) in the same transaction; a conflict
rolls everything back and refuses the sign-in with a page that says why, and the portal admins are told.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter, get_adapter
from allauth.socialaccount.internal import jwtkit
from allauth.socialaccount.models import SocialAccount, SocialApp, SocialLogin
from allauth.socialaccount.providers.base.constants import AuthError
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from allauth.socialaccount.providers.oauth2.views import OAuth2CallbackView, OAuth2LoginView
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from tenants.directory import DirectoryConflict, SignInClaims, directory_conflict_notify, directory_sign_in_apply
from tenants.invitations import invitations_accept
from tenants.services import audit_record

logger = logging.getLogger(__name__)

PROVIDER = "openid_connect"
# Who signed in through which provider, with the raw ID token: the hint RP-initiated logout sends back.
SESSION_KEY = "portal_oidc_sign_in"
REFUSAL_TEMPLATE = "socialaccount/authentication_error.html"

# Why PyJWT refused an ID token, in words for the person who was trying to sign in.
_ID_TOKEN_PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.InvalidSignatureError, "its signature does not match the keys {provider} publishes: it was altered"),
    (jwt.InvalidAudienceError, "it was issued for another application, not for this portal"),
    (jwt.ExpiredSignatureError, "it has expired (the sign-in took too long, or a clock is wrong)"),
    (jwt.ImmatureSignatureError, "it is not valid yet (a clock is wrong)"),
    (jwt.InvalidIssuerError, "it was issued by someone other than {provider}"),
    (jwt.DecodeError, "it is not a readable signed token"),
)


class IdTokenRefused(OAuth2Error):  # type: ignore[misc]
    """The provider's ID token was not accepted; the message says why, for the person signing in."""


def _refused(provider_name: str, problem: str) -> IdTokenRefused:
    return IdTokenRefused(
        f"The identity token from {provider_name} was refused: {problem}. Nobody was signed in; start again "
        "from the login page, and tell your portal admin if this happens again."
    )


class PortalOpenIDConnectAdapter(OpenIDConnectOAuth2Adapter):  # type: ignore[misc]
    """allauth's adapter, checking every ID token's signature and nonce."""

    expected_nonce: str | None = None

    def complete_login(self, request: HttpRequest, app: SocialApp, token: Any, **kwargs: Any) -> SocialLogin:
        id_token = kwargs["response"].get("id_token")
        if not id_token:
            raise IdTokenRefused(f"{app.name} answered without an identity token; it is not speaking OpenID Connect.")
        login = super().complete_login(request, app, token, **kwargs)
        # Kept on the request until the portal signs the person in (NoSelfSignupAdapter.login puts it in the session).
        request.portal_oidc_sign_in = {"provider": self.provider_id, "id_token": id_token}  # type: ignore[attr-defined]
        return login

    def _decode_id_token(self, app: SocialApp, id_token: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwtkit.verify_and_decode(
                credential=id_token,
                keys_url=self.openid_config["jwks_uri"],
                issuer=self.openid_config["issuer"],
                audience=app.client_id,
                lookup_kid=jwtkit.lookup_kid_jwk,
                verify_signature=True,
            )
        except OAuth2Error as exc:
            cause = exc.__cause__
            problem = next((text for kind, text in _ID_TOKEN_PROBLEMS if isinstance(cause, kind)), None)
            if problem is None and cause is None:
                problem = f"it was signed with a key {{provider}} does not publish ({exc})"
            raise _refused(app.name, (problem or f"{exc} ({cause})").format(provider=app.name)) from exc
        nonce = str(claims.get("nonce", ""))
        if not self.expected_nonce or not hmac.compare_digest(nonce, self.expected_nonce):
            raise _refused(app.name, "it belongs to another sign-in than this one (its nonce differs): a replay")
        return claims


class PortalOpenIDConnectProvider(OpenIDConnectProvider):  # type: ignore[misc]
    """allauth's OpenID Connect provider, sending a fresh nonce with every sign-in (kept in the sign-in's state)."""

    oauth2_adapter_class = PortalOpenIDConnectAdapter

    def redirect(
        self, request: HttpRequest, process: Any, next_url: str | None = None, data: Any = None, **kwargs: Any
    ) -> HttpResponse:
        nonce = secrets.token_urlsafe(32)
        auth_params = kwargs.pop("auth_params", None)
        if auth_params is None:
            auth_params = self.get_auth_params()
        auth_params = {**auth_params, "nonce": nonce}
        response: HttpResponse = super().redirect(
            request, process, next_url, data, auth_params=auth_params, nonce=nonce, **kwargs
        )
        return response


class PortalCallbackView(OAuth2CallbackView):  # type: ignore[misc]
    """allauth's callback, handing the sign-in's nonce (from its state, used once) to the adapter's ID token check."""

    def _get_state(self, request: HttpRequest, provider: Any) -> tuple[dict[str, Any] | None, HttpResponse | None]:
        state, response = super()._get_state(request, provider)
        if state is not None:
            self.adapter.expected_nonce = state.get("nonce")
        return state, response


def _allauth_view(view_class: Any, request: HttpRequest, provider_id: str) -> HttpResponse:
    try:
        view = view_class.adapter_view(PortalOpenIDConnectAdapter(request, provider_id))
        response: HttpResponse = view(request)
    except SocialApp.DoesNotExist:
        raise Http404(f"No sign-in provider '{provider_id}' is configured.") from None
    return response


def sign_in_start(request: HttpRequest, provider_id: str) -> HttpResponse:
    """POST: off to the provider (GET shows a page with the button, so no link elsewhere can start a sign-in)."""
    return _allauth_view(OAuth2LoginView, request, provider_id)


def sign_in_callback(request: HttpRequest, provider_id: str) -> HttpResponse:
    """Where the provider sends the browser back with the code and the state."""
    return _allauth_view(PortalCallbackView, request, provider_id)


# The sign-in page and logout ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SignInProvider:
    id: str
    name: str
    start_url: str


def sign_in_providers(request: HttpRequest) -> list[SignInProvider]:
    """The providers the login page offers, in the order they are configured."""
    apps = get_adapter().list_apps(request, provider=PROVIDER)
    return [
        SignInProvider(
            id=app.provider_id,
            name=app.name,
            start_url=reverse("openid_connect_login", kwargs={"provider_id": app.provider_id}),
        )
        for app in apps
    ]


def end_session_url(request: HttpRequest, *, sign_in: dict[str, str], after_logout_url: str) -> str | None:
    """Where to send a browser that signed in through a provider when it logs out of the portal
    (OpenID Connect RP-initiated logout), so that it is signed out there too; None when the provider has no
    end-session endpoint, is no longer configured or cannot be reached (the portal's own logout still holds)."""
    provider_id = sign_in.get("provider", "")
    try:
        adapter = PortalOpenIDConnectAdapter(request, provider_id)
        app = adapter.get_provider().app
        endpoint = adapter.openid_config.get("end_session_endpoint")
    except (SocialApp.DoesNotExist, requests.RequestException, ValueError) as exc:
        logger.warning("logout: no end-session endpoint of provider %r: %s", provider_id, exc)
        return None
    if not endpoint:
        return None
    query = {"client_id": app.client_id, "post_logout_redirect_uri": after_logout_url}
    if sign_in.get("id_token"):
        query["id_token_hint"] = sign_in["id_token"]
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"


# allauth's hooks ----------------------------------------------------------------------------------------


def _refusal(request: HttpRequest, *, provider_name: str, message: str, status: int) -> ImmediateHttpResponse:
    logger.warning("sign-in through %s refused: %s", provider_name, message)
    context = {"provider_name": provider_name, "message": message}
    return ImmediateHttpResponse(render(request, REFUSAL_TEMPLATE, context, status=status))


def _state_problem(provider_name: str) -> str:
    return (
        f"This answer from {provider_name} does not belong to a sign-in started in this browser: it was already "
        "used, is more than 10 minutes old, or was started elsewhere. Nobody was signed in; start again from the "
        "login page."
    )


class SignInAdapter(DefaultSocialAccountAdapter):  # type: ignore[misc]
    """How a sign-in through a provider becomes a portal account, and how refusals read."""

    def is_open_for_signup(self, request: HttpRequest, sociallogin: SocialLogin) -> bool:
        return True

    def pre_social_login(self, request: HttpRequest, sociallogin: SocialLogin) -> None:
        provider = sociallogin.account.get_provider()
        name = provider.app.name
        if sociallogin.is_existing:
            if not sociallogin.user.is_active:
                raise self._refuse(
                    request, name, "Your portal account is deactivated. Nobody was signed in; ask your portal admin."
                )
            self._with_directory(request, sociallogin, lambda: _profile_update(sociallogin))
            return
        claims = provider.account_class(sociallogin.account).get_user_data() or {}
        username = claims.get("preferred_username")
        if not username:
            raise self._refuse(
                request,
                name,
                f"{name} did not tell the portal your username (the preferred_username claim). Ask its "
                "administrators to release it to this portal.",
            )
        try:
            User.username_validator(username)
            if len(username) > User._meta.get_field("username").max_length:  # type: ignore[operator]
                raise ValidationError("too long")
        except ValidationError:
            raise self._refuse(
                request,
                name,
                f"Your username at {name}, '{username}', cannot be a portal username (at most 150 letters, digits "
                "and @.+-_). Ask your portal admin.",
            ) from None
        existing = get_user_model().objects.filter(username=username).first()
        if existing is None:
            return
        already_linked = SocialAccount.objects.filter(user=existing, provider=sociallogin.account.provider).exists()
        if not provider.app.settings.get("connect_existing_users") or already_linked:
            raise self._refuse(
                request,
                name,
                f"The username '{username}' already belongs to another portal account, which is not connected to "
                f"your identity at {name}. Nobody was signed in; ask your portal admin to connect the two.",
            )

        def connect() -> User:
            sociallogin.connect(request, existing)
            audit_record(
                actor=existing,
                action="user.sign_in_connected",
                target=existing,
                tenant=None,
                before=None,
                after=_identity_state(sociallogin, name),
            )
            return existing

        self._with_directory(request, sociallogin, connect)

    def save_user(self, request: HttpRequest, sociallogin: SocialLogin, form: Any = None) -> Any:
        """A newcomer's first sign-in: the account, its audit event and what the directory gives them, in one
        transaction."""

        def create() -> User:
            user: User = super(SignInAdapter, self).save_user(request, sociallogin, form)
            audit_record(
                actor=user,
                action="user.created_by_sign_in",
                target=user,
                tenant=None,
                before=None,
                after=_identity_state(sociallogin, sociallogin.account.get_provider().app.name),
            )
            return user

        return self._with_directory(request, sociallogin, create)

    def _with_directory(self, request: HttpRequest, sociallogin: SocialLogin, change: Callable[[], User]) -> User:
        """`change` (making or finding the account), then the directory's roles and POSIX users from the claims,
        all in one transaction. A conflict rolls it all back, tells the admins and refuses the sign-in."""
        name = sociallogin.account.get_provider().app.name
        claims = _claims(sociallogin)
        try:
            with transaction.atomic():
                user = change()
                directory_sign_in_apply(
                    SignInClaims(user=user, provider_id=sociallogin.account.provider, provider_name=name, claims=claims)
                )
                # Invitations wait for an address: only one the provider says it verified may claim them.
                if claims.get("email_verified") is True and claims.get("email"):
                    invitations_accept(user=user, verified_email=str(claims["email"]))
        except DirectoryConflict as conflict:
            username = str(claims.get("preferred_username") or sociallogin.account.uid)
            directory_conflict_notify(provider_name=name, username=username, problem=conflict.problem)
            raise self._refuse(
                request,
                name,
                f"{conflict.problem} Nobody was signed in and nothing was changed; the portal admins have been told.",
            ) from conflict
        return user

    def on_authentication_error(
        self,
        request: HttpRequest,
        provider: Any,
        error: str | None = None,
        exception: Exception | None = None,
        extra_context: dict[str, Any] | None = None,
    ) -> None:
        name = provider.app.name
        context = extra_context or {}
        if isinstance(exception, IdTokenRefused):
            message = str(exception)
        elif error == AuthError.CANCELLED:
            message = f"You cancelled the sign-in at {name}. Nobody was signed in."
        elif "state" not in context and exception is None:
            message = _state_problem(name)
        elif exception is None:
            said = request.GET.get("error_description") or request.GET.get("error") or "no reason given"
            message = f"{name} did not sign you in: {said}."
        elif isinstance(exception, requests.RequestException):
            message = f"{name} could not be reached to finish the sign-in ({type(exception).__name__}); try again."
        else:
            message = f"{name} did not finish the sign-in: {exception}. Nobody was signed in; start again."
        raise _refusal(request, provider_name=name, message=message, status=401)

    def _refuse(self, request: HttpRequest, provider_name: str, message: str) -> ImmediateHttpResponse:
        request.portal_oidc_sign_in = None  # type: ignore[attr-defined]
        return _refusal(request, provider_name=provider_name, message=message, status=403)


def _claims(sociallogin: SocialLogin) -> dict[str, Any]:
    """What the provider said about the person in this sign-in: the ID token's claims and the userinfo's."""
    data = sociallogin.account.extra_data or {}
    return {**(data.get("id_token") or {}), **(data.get("userinfo") or {})}


# The account's fields the provider keeps up to date at each sign-in: the claim each comes from, and its length.
_PROFILE_CLAIMS = {"email": ("email", 254), "first_name": ("given_name", 150), "last_name": ("family_name", 150)}


def _profile_update(sociallogin: SocialLogin) -> User:
    """A returning person's e-mail and names as the provider now has them (audited when they changed)."""
    user: User = sociallogin.user
    claims = _claims(sociallogin)
    before = {field: getattr(user, field) for field in _PROFILE_CLAIMS}
    after = {
        field: str(claims[claim])[:max_length]
        for field, (claim, max_length) in _PROFILE_CLAIMS.items()
        if claims.get(claim)
    }
    after = before | after
    if after != before:
        for field, value in after.items():
            setattr(user, field, value)
        user.save(update_fields=list(_PROFILE_CLAIMS))
        audit_record(actor=user, action="user.updated_by_sign_in", target=user, tenant=None, before=before, after=after)
    return user


def _identity_state(sociallogin: SocialLogin, provider_name: str) -> dict[str, Any]:
    user = sociallogin.user
    return {
        "username": user.get_username(),
        "email": user.email,
        "provider": sociallogin.account.provider,
        "provider_name": provider_name,
        "subject": sociallogin.account.uid,
    }


class NoSelfSignupAdapter(DefaultAccountAdapter):  # type: ignore[misc]
    """Nobody makes a local account for themselves; accounts come from admins or a provider's sign-in."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False

    def get_login_stages(self) -> list[str]:
        """Not allauth.mfa's code step: a provider's sign-in has the provider's own second factor, and the portal's
        (frontend/two_factor_views.py) follows portal passwords only."""
        return [stage for stage in super().get_login_stages() if not stage.startswith("allauth.mfa.")]

    def login(self, request: HttpRequest, user: Any) -> None:
        super().login(request, user)
        sign_in = getattr(request, "portal_oidc_sign_in", None)
        if sign_in:
            request.session[SESSION_KEY] = sign_in

    def add_message(self, *args: Any, **kwargs: Any) -> None:
        """No "Successfully signed in as ..." banner: the dashboard says who is signed in."""
