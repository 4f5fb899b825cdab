"""The app `celery -A workers.celery_app worker` loads; configured by `INTERLOCK_*`."""

from __future__ import annotations

from .app import create_app
from .settings import Settings

app = create_app(Settings.from_env())
