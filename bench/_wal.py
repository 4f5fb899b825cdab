"""What a SQLite database in WAL mode was given to write: its write-ahead log, read as the
file format defines it (https://sqlite.org/fileformat.html#the_write_ahead_log).

Every transaction that writes appends its pages to the WAL as frames; its last frame is
its commit record. Under `synchronous=FULL` each commit record is flushed to the disk
before the commit returns, so the commits counted here are the waits for the disk a
system's work costs, whatever library issued them.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

__all__ = ["checkpoint", "wal_bytes", "wal_commits"]

_HEADER = 32  # the WAL header: magic, version, page size, checkpoint, salts, checksums
_FRAME_HEADER = 24  # page number, pages after commit (0: not a commit), salts, checksums
_MAGIC = (0x377F0682, 0x377F0683)


def _wal_of(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def checkpoint(db: Path) -> None:
    """Copy the WAL into the database and truncate it to nothing, so that what follows
    is all the WAL holds. Raises when a reader or writer held it back."""
    with sqlite3.connect(db) as raw:
        busy, log, done = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy or log != done:
        raise RuntimeError(f"{db.name}: the WAL checkpoint was held back ({busy}, {log}, {done})")
    if wal_bytes(db):
        raise RuntimeError(f"{db.name}: the WAL was not truncated")


def wal_bytes(db: Path) -> int:
    """The WAL's size in bytes (0 when there is none)."""
    wal = _wal_of(db)
    return wal.stat().st_size if wal.exists() else 0


def wal_commits(db: Path) -> int:
    """The commits in the WAL since it was last reset: the frames, of the WAL's current
    salt, that end a transaction. (A checkpoint that resets the WAL starts it over;
    count over fewer frames than `wal_autocheckpoint`, 1,000 pages by default.)"""
    wal = _wal_of(db)
    if not wal.exists():
        return 0
    data = wal.read_bytes()
    if len(data) < _HEADER:
        return 0
    magic, _version, page_size, _seq, salt1, salt2 = struct.unpack(">6I", data[:24])
    if magic not in _MAGIC:
        raise ValueError(f"{wal.name} is not a SQLite WAL")
    commits = 0
    frame = _FRAME_HEADER + page_size
    for offset in range(_HEADER, len(data) - frame + 1, frame):
        _page, after, s1, s2 = struct.unpack(">4I", data[offset : offset + 16])
        if (s1, s2) != (salt1, salt2):
            break  # frames of an earlier generation of the WAL: not this one's
        if after:
            commits += 1
    return commits
