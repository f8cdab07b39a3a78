"""Browser pages. Login and logout are Django's own views (login limited against guessing, see login_views);
each area of the portal lists its pages in its own module (views for the dashboard, job_views, cluster_views,
project_views, billing_views, staff_views)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

from frontend import billing_views, cluster_views, job_views, project_views, staff_views, views
from frontend.login_views import LoginView

urlpatterns: list[URLPattern] = [
    path("login/", LoginView.as_view(), name="login"),
    # Django's LogoutView accepts POST only, so a link or an image on another site cannot log users out.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    *views.urlpatterns,
    *job_views.urlpatterns,
    *cluster_views.urlpatterns,
    *project_views.urlpatterns,
    *billing_views.urlpatterns,
    *staff_views.urlpatterns,
]
