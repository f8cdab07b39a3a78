"""WebSocket routes of the jobs app."""

from django.urls import path

from jobs.consumers import JobConsumer, ProjectJobsConsumer
from jobs.log_stream import JobLogConsumer

websocket_urlpatterns = [
    path("ws/projects/<str:tenant>/<str:project>/jobs/", ProjectJobsConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/log/", JobLogConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_id>/", JobConsumer.as_asgi()),
]
