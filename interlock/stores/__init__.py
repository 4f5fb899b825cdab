"""Session stores: where snapshots live between turns."""

from .base import LatestSnapshotId, SessionStore
from .memory import InMemorySessionStore
from .sql import SqlSessionStore

__all__ = ["InMemorySessionStore", "LatestSnapshotId", "SessionStore", "SqlSessionStore"]
