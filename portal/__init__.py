"""Project package: settings, URLs, ASGI routing and the Celery app (no models)."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
