"""Top-level URL routes: the browser pages, the Django admin, the REST API and its docs, health."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from portal.apis import MeApi
from portal.health import healthz
from portal.metrics_views import metrics

# The API first, its busiest routes (jobs) at its head: Django tries the patterns in order, and the pages' many
# patterns (under "") would otherwise be tried, and missed, for every API request.
urlpatterns = [
    path("api/v1/", include("jobs.api_urls")),
    path("api/v1/me/", MeApi.as_view(), name="api-me"),
    path("api/v1/", include("tenants.api_urls")),
    path("api/v1/", include("clusters.api_urls")),
    path("api/v1/", include("quotas.api_urls")),
    path("api/v1/", include("quotas.request_apis")),
    path("api/v1/", include("tenants.notification_apis")),
    path("api/v1/", include("billing.api_urls")),
    path("api/v1/", include("billing.estimate_apis")),
    path("api/v1/", include("billing.reconciliation_apis")),
    path("api/v1/", include("billing.efficiency_apis")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("frontend.urls")),
]

handler400 = "portal.api_errors.handler400"
handler404 = "portal.api_errors.handler404"
handler500 = "portal.api_errors.handler500"
