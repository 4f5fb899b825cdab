"""The `interlock` command line. Each command prints JSON lines on success, and a clear
message with a non-zero exit on error."""

from . import admin, prune, resend, serve, turns  # noqa: F401  (each module adds its commands to `main`)
from .base import main

__all__ = ["main"]
