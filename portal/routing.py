"""All WebSocket routes, collected from the apps (the isolation matrix walks this list)."""

from jobs.routing import websocket_urlpatterns as jobs_websocket_urlpatterns

websocket_urlpatterns = [*jobs_websocket_urlpatterns]
