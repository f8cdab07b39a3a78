"""Browser pages. Login and logout are Django's own views (login limited against guessing, logout going on to
the OpenID provider a person signed in with, see login_views); sign-in through OpenID providers is
django-allauth's (tenants/oidc.py). Each area of the portal lists its pages in its own module (views for the
dashboard, job_views, cluster_views, project_views, billing_views, staff_views, staff_console_views)."""

from __future__ import annotations

from django.urls import URLPattern, path

from frontend import (
    account_views,
    billing_views,
    cluster_views,
    job_views,
    project_views,
    spend_views,
    staff_console_views,
    staff_views,
    two_factor_views,
    views,
)
from frontend.login_views import LoginView, LogoutView
from tenants.oidc import sign_in_callback, sign_in_start

urlpatterns: list[URLPattern] = [
    path("login/", LoginView.as_view(), name="login"),
    # Django's LogoutView accepts POST only, so a link or an image on another site cannot log users out.
    path("logout/", LogoutView.as_view(), name="logout"),
    # allauth's openid_connect URL names, which its provider reverses.
    path("oidc/<str:provider_id>/login/", sign_in_start, name="openid_connect_login"),
    path("oidc/<str:provider_id>/login/callback/", sign_in_callback, name="openid_connect_callback"),
    *two_factor_views.urlpatterns,
    *account_views.urlpatterns,
    *views.urlpatterns,
    *job_views.urlpatterns,
    *cluster_views.urlpatterns,
    *project_views.urlpatterns,
    *billing_views.urlpatterns,
    *spend_views.urlpatterns,
    *staff_views.urlpatterns,
    *staff_console_views.urlpatterns,
]
