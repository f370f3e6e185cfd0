"""The Celery application (broker and results on REDIS_URL)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("streamwise")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
