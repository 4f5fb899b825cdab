"""Session stores: where snapshots live between turns."""

from .base import SessionStore
from .memory import InMemorySessionStore
from .sql import SqlSessionStore

__all__ = ["InMemorySessionStore", "SessionStore", "SqlSessionStore"]
