"""Top-level URL routes."""

from django.contrib import admin
from django.urls import path

from portal.health import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
]
