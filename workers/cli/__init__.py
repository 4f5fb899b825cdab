"""The `interlock` command line. Each command prints JSON lines on success, and a clear
message with a non-zero exit on error."""

from .commands import main

__all__ = ["main"]
