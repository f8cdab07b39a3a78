"""The ASGI application: Django for HTTP, Channels for WebSockets (a session from the portal's own pages, or a
bearer token)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from portal.metrics import WebsocketsCounted  # noqa: E402
from portal.request_ids import WebsocketRequestIdMiddleware  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402
from portal.startup import routes_load  # noqa: E402
from portal.ws_auth import (  # noqa: E402
    BearerTokenWebsocketMiddleware,
    SameOriginOrBearerValidator,
    UnknownWebsocketRoute,
)

routes_load()  # as uvicorn starts, not in its first request

# Every route, then a refusal (4404) for any other address.
websocket_routes = URLRouter([*websocket_urlpatterns, re_path(r"", UnknownWebsocketRoute.as_asgi())])

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # A request id for the connection's log lines (portal/request_ids.py); origin and identity rules:
        # portal/ws_auth.py. Outermost, the count of open sockets per route.
        "websocket": WebsocketsCounted(
            WebsocketRequestIdMiddleware(
                SameOriginOrBearerValidator(AuthMiddlewareStack(BearerTokenWebsocketMiddleware(websocket_routes)))
            ),
            routes=websocket_urlpatterns,
        ),
    }
)
