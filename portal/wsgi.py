"""The WSGI application: pages and the REST API under a WSGI server (gunicorn); WebSockets stay on portal.asgi.

Which server serves what, and why: README, "Operations" > "Processes".
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()
