"""Who holds a turn's lease, as a process: a lease's owner names its host, its PID
namespace and its process, so a worker can tell that the holder was a process of its
own machine that has died (a pool process killed mid-turn, a worker restarted) and take
the turn over at once instead of waiting for the lease to run out."""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["died_here", "process_id"]


def _pid_namespace() -> str:
    """This process's PID namespace (Linux); empty where it cannot be told, and then no
    holder is ever judged dead."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


_made: tuple[int, str] | None = None
"""`process_id()` as last made, with the pid it was made in (a fork makes it again)."""


def process_id() -> str:
    """`HOST:PIDNS:PID`, the start of every lease owner this process takes (made once
    per process: it is asked for on every turn)."""
    global _made
    pid = os.getpid()
    if _made is None or _made[0] != pid:
        _made = (pid, f"{socket.gethostname()}:{_pid_namespace()}:{pid}")
    return _made[1]


def died_here(owner: str) -> bool:
    """True only when `owner` (`HOST:PIDNS:PID:...`) was a process of this host and PID
    namespace that no longer runs (or is a zombie). Anything else (another machine,
    another container, a live process, a PID taken again, an owner of another form)
    is False: the lease is then left to run out."""
    parts = owner.split(":")
    if len(parts) < 3 or not parts[2].isdigit():
        return False
    host, namespace, pid = parts[0], parts[1], int(parts[2])
    if host != socket.gethostname() or not namespace or namespace != _pid_namespace():
        return False
    if pid == os.getpid() or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it runs, as another user
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has exited and not yet been reaped by its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()
    return bool(state) and state[0] in ("Z", "X")
