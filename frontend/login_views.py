"""The browser's login page and logout.

Login: a button per OpenID provider (tenants/oidc.py) and, unless PORTAL_LOCAL_PASSWORDS is false, Django's
password form, with wrong passwords limited per client address and per account from that address, together
with `POST /api/v1/tokens/` (tenants/throttles.py). Over a limit, the form is shown again with the wait and the
password is not checked. Someone with two-factor sign-in is sent on to the code step (two_factor_views).
Logout: Django's, then, for someone who signed in through a provider, on to the provider's end-session endpoint
so that they are signed out there too (RP-initiated logout).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from frontend.two_factor_views import password_sign_in_continue, password_signed_in
from tenants.backends import LOCAL_PASSWORDS_OFF, local_passwords_enabled
from tenants.invitations import invitations_accept
from tenants.oidc import SESSION_KEY, end_session_url, sign_in_providers
from tenants.throttles import password_attempt_wait, password_failure_record, request_address


def _wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{round(seconds / 60)} minutes"


class LoginView(auth_views.LoginView):
    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sign_in_providers"] = sign_in_providers(self.request)
        context["local_passwords"] = local_passwords_enabled()
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not local_passwords_enabled():
            context = self.get_context_data(form=self.get_form_class()(request), passwords_refused=LOCAL_PASSWORDS_OFF)
            return self.render_to_response(context, status=403)
        wait = password_attempt_wait(address=request_address(request), username=request.POST.get("username", ""))
        if wait is not None:
            return self._throttled(wait)
        return super().post(request, *args, **kwargs)

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        # Someone with two-factor sign-in gives their code first, and is signed in only then.
        code_step = password_sign_in_continue(self.request, user=form.get_user(), next_url=self.get_redirect_url())
        if code_step is not None:
            return code_step
        # A password sign-in ends whatever provider sign-in this browser's session still remembered.
        self.request.session.pop(SESSION_KEY, None)
        response = super().form_valid(form)
        password_signed_in(self.request)
        # The account's address was given by a portal admin (nobody makes their own account): it may claim invitations.
        invitations_accept(user=form.get_user(), verified_email=form.get_user().email)
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        username = self.request.POST.get("username", "")
        password_failure_record(address=request_address(self.request), username=username)
        return super().form_invalid(form)

    def _throttled(self, wait: int) -> HttpResponse:
        message = (
            f"Too many failed log-in attempts came from your address, or for this account from it. Wait "
            f"{_wait_text(wait)}, then try again; "
            "if you have forgotten your password, ask your portal admin to reset it."
        )
        context = self.get_context_data(form=self.get_form_class()(self.request), throttled=message)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(wait)
        return response


class LogoutView(auth_views.LogoutView):
    """Django's logout (POST only, so no link or image elsewhere logs anyone out), then the provider's."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        sign_in = request.session.get(SESSION_KEY)
        response = super().post(request, *args, **kwargs)
        if sign_in:
            provider_logout = end_session_url(
                request, sign_in=sign_in, after_logout_url=request.build_absolute_uri(reverse("login"))
            )
            if provider_logout:
                return HttpResponseRedirect(provider_logout)
        return response
