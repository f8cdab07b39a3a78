"""All WebSocket routes, collected from the apps (the isolation matrix walks this list)."""

from clusters.routing import websocket_urlpatterns as clusters_websocket_urlpatterns
from jobs.routing import websocket_urlpatterns as jobs_websocket_urlpatterns

websocket_urlpatterns = [*clusters_websocket_urlpatterns, *jobs_websocket_urlpatterns]
