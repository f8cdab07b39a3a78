"""The WSGI application: pages and the REST API under a WSGI server (gunicorn); WebSockets stay on portal.asgi.

Which server serves what, and why: README, "Operations" > "Processes".
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()

from portal.startup import routes_load  # noqa: E402  (needs Django set up first)

routes_load()  # in each gunicorn worker as it starts, not in its first request
