"""Interlock on the queue: the Celery app, the resume consumer, settings and the CLI."""
