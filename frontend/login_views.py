"""The browser's login form: Django's own view, with wrong passwords limited per client address and per
account from that address, together with `POST /api/v1/tokens/` (tenants/throttles.py). Over a limit, the form
is shown again with the wait and the password is not checked.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse

from tenants.throttles import password_attempt_wait, password_failure_record, request_address


def _wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{round(seconds / 60)} minutes"


class LoginView(auth_views.LoginView):
    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        wait = password_attempt_wait(address=request_address(request), username=request.POST.get("username", ""))
        if wait is not None:
            return self._throttled(wait)
        return super().post(request, *args, **kwargs)

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
