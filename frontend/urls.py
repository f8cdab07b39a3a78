"""Browser pages: login, logout and the home page. The full portal UI will join them here."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

from frontend import views

urlpatterns: list[URLPattern] = [
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="frontend/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    # Django's LogoutView accepts POST only, so a link or an image on another site cannot log users out.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    path("billing/invoices/<int:invoice_id>/print/", views.invoice_print, name="invoice-print"),
]
