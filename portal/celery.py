"""The Celery application: workers and beat load Django settings and discover each app's tasks."""

import os

from celery import Celery

from portal.metrics import celery_signals_connect

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Every process that sends tasks stamps them, and every worker counts and times what it runs (README, "Metrics").
celery_signals_connect()
