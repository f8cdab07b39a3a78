"""WebSocket routes of the clusters app."""

from django.urls import path

from clusters.consumers import ClusterStatusConsumer

websocket_urlpatterns = [
    path("ws/clusters/", ClusterStatusConsumer.as_asgi()),
]
