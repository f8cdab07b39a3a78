"""Two-factor sign-in in the browser (tenants/two_factor.py): the code step after a right password, the page where
people turn it on (QR code and secret for their authenticator app) or off, and the gate that holds password
sessions until their second factor is done.

The login view (login_views) does not sign in someone with an authenticator after their password: it remembers
them in the session for five minutes and sends them here for the code. The gate covers every other way a
password may sign someone in (the Django admin's form): such a session without its code is ended, and staff
who must have two-factor sign-in (PORTAL_MFA_REQUIRED_FOR_STAFF) are sent to set it up before anything else.
Sessions from an OpenID provider are the provider's business and pass.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from allauth.mfa.adapter import get_adapter as mfa_adapter
from allauth.mfa.totp.internal.auth import clear_totp_secret, get_totp_secret
from django.contrib import messages
from django.contrib.auth import BACKEND_SESSION_KEY, get_user_model, login, logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_http_methods

from portal.api_errors import error_body
from tenants.invitations import invitations_accept
from tenants.oidc import SESSION_KEY as PROVIDER_SIGN_IN_KEY
from tenants.throttles import password_attempt_wait, password_failure_record, request_address
from tenants.two_factor import (
    TwoFactorRefused,
    totp_code_check,
    totp_disable,
    totp_enable,
    totp_enabled,
    totp_required,
)

# {"user": pk, "backend": ..., "next": ..., "at": unix time}: a right password waiting for its code.
PENDING_KEY = "portal_two_factor_pending"
# "verified": the code was given (or two-factor was just turned on); "none": no authenticator at sign-in.
STATE_KEY = "portal_two_factor"
PENDING_SECONDS = 300
SETUP_PATH = "/account/two-factor/"
# What staff who must set two-factor up may still reach.
SETUP_ALLOWED_PREFIXES = (SETUP_PATH, "/logout/", "/login/", "/static/", "/healthz")
SETUP_REQUIRED = "This portal requires two-factor sign-in for staff: set it up to go on."


def password_sign_in_continue(request: HttpRequest, *, user: Any, next_url: str) -> HttpResponse | None:
    """After a right password: None to sign in at once, or the redirect to the code step for someone with an
    authenticator (not signed in until the code is right)."""
    if not totp_enabled(user):
        return None
    request.session[PENDING_KEY] = {
        "user": user.pk,
        "backend": user.backend,
        "next": next_url,
        "at": int(time.time()),
    }
    return HttpResponseRedirect("/login/code/")


def password_signed_in(request: HttpRequest) -> None:
    """Called once Django's login has signed someone in by password without a code (they have no authenticator)."""
    request.session[STATE_KEY] = "none"


def _pending(request: HttpRequest) -> dict[str, Any] | None:
    pending = request.session.get(PENDING_KEY)
    if not isinstance(pending, dict) or time.time() - pending.get("at", 0) > PENDING_SECONDS:
        request.session.pop(PENDING_KEY, None)
        return None
    return pending


@require_http_methods(["GET", "POST"])
def login_code_page(request: HttpRequest) -> HttpResponse:
    pending = _pending(request)
    if pending is None:
        messages.info(request, "Log in again: the code step lasts five minutes after your password.")
        return redirect("login")
    user = get_user_model().objects.filter(pk=pending["user"], is_active=True).first()
    if user is None:
        request.session.pop(PENDING_KEY, None)
        return redirect("login")
    context: dict[str, Any] = {"error": None}
    status = 200
    if request.method == "POST":
        address = request_address(request)
        wait = password_attempt_wait(address=address, username=user.get_username())
        if wait is not None:
            context["error"] = f"Too many wrong codes. Wait {wait} seconds, then try again."
            response = render(request, "frontend/two_factor/code.html", context, status=429)
            response["Retry-After"] = str(wait)
            return response
        if totp_code_check(user=user, code=request.POST.get("code", "")):
            next_url = pending.get("next") or "/"
            del request.session[PENDING_KEY]
            login(request, user, backend=pending["backend"])
            invitations_accept(user=user, verified_email=user.email)
            request.session.pop(PROVIDER_SIGN_IN_KEY, None)
            request.session[STATE_KEY] = "verified"
            return HttpResponseRedirect(next_url if _safe(request, next_url) else "/")
        password_failure_record(address=address, username=user.get_username())
        context["error"] = "That code is not right. Type the six digits your authenticator app shows now."
        status = 400
    return render(request, "frontend/two_factor/code.html", context, status=status)


def _safe(request: HttpRequest, url: str) -> bool:
    return url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}, require_https=request.is_secure())


@login_required
@require_http_methods(["GET", "POST"])
def two_factor_page(request: HttpRequest) -> HttpResponse:
    user = request.user
    error = None
    if request.method == "POST":
        try:
            if request.POST.get("action") == "disable":
                totp_disable(user=user)  # type: ignore[arg-type]
                messages.success(request, "Two-factor sign-in is off.")
                request.session[STATE_KEY] = "none"
                return redirect("two-factor")
            totp_enable(user=user, secret=get_totp_secret(), code=request.POST.get("code", ""))  # type: ignore[arg-type]
        except TwoFactorRefused as refusal:
            error = refusal.problem
        else:
            clear_totp_secret(request)
            request.session[STATE_KEY] = "verified"
            messages.success(request, "Two-factor sign-in is on: you will be asked for a code after your password.")
            return redirect("two-factor")
    context: dict[str, Any] = {
        "enabled": totp_enabled(user),
        "required": totp_required(user),
        "must_set_up": _must_set_up(request),
        "error": error,
    }
    if not context["enabled"]:
        # A new secret on each visit, kept in the session until a code proves the app has it.
        secret = get_totp_secret(regenerate=request.method == "GET")
        svg = mfa_adapter().build_totp_svg(mfa_adapter().build_totp_url(user, secret))
        context["secret"] = secret
        context["qr_code"] = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return render(request, "frontend/two_factor/setup.html", context, status=400 if error else 200)


def _password_session(request: HttpRequest) -> bool:
    return (
        request.user.is_authenticated
        and BACKEND_SESSION_KEY in request.session
        and PROVIDER_SIGN_IN_KEY not in request.session
    )


def _must_set_up(request: HttpRequest) -> bool:
    return _password_session(request) and totp_required(request.user) and not totp_enabled(request.user)


View = Callable[[HttpRequest], HttpResponse]


def two_factor_gate(get_response: View) -> View:
    def middleware(request: HttpRequest) -> HttpResponse:
        if not _password_session(request):
            return get_response(request)
        state = request.session.get(STATE_KEY)
        if state is None:
            # Signed in by a password elsewhere than the login page (the Django admin's form).
            if totp_enabled(request.user):
                logout(request)
                return HttpResponseRedirect("/login/?" + urlencode({"next": request.get_full_path()}))
            request.session[STATE_KEY] = state = "none"
        if state == "none" and totp_required(request.user) and not request.path.startswith(SETUP_ALLOWED_PREFIXES):
            if request.path.startswith("/api/"):
                return JsonResponse(error_body(code="two_factor_required", message=SETUP_REQUIRED), status=403)
            messages.warning(request, SETUP_REQUIRED)
            return HttpResponseRedirect(SETUP_PATH)
        return get_response(request)

    return middleware


urlpatterns: list[URLPattern] = [
    path("login/code/", login_code_page, name="login-code"),
    path("account/two-factor/", two_factor_page, name="two-factor"),
]
