"""WebSocket routes of the jobs app."""

from django.urls import path

from jobs.consumers import ClusterStatusConsumer

websocket_urlpatterns = [
    path("ws/clusters/", ClusterStatusConsumer.as_asgi()),
]
