"""Where our in-process cycle spends its time: pyinstrument over the banking cycle.

    pip install pyinstrument        # not a dependency of Interlock, nor of `.[bench]`
    python -m bench.profile_cycle [--store sqlite|memory] [--cycles N]

Prints pyinstrument's call tree (library frames folded) for N cycles after a warm-up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from interlock import InMemorySessionStore, SqlSessionStore

from ._common import banking_agent, interlock_cycle

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_cycle", description=__doc__)
    parser.add_argument(
        "--store", choices=("sqlite", "memory"), default="sqlite", help="default: sqlite"
    )
    parser.add_argument("--cycles", type=int, default=500, help="profiled cycles (500)")
    args = parser.parse_args(argv)
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("pyinstrument is not installed: pip install pyinstrument", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="interlock-profile-") as tmp:
        store = (
            SqlSessionStore(f"sqlite:///{Path(tmp) / 'profile.db'}")
            if args.store == "sqlite"
            else InMemorySessionStore()
        )
        agent = banking_agent(store)
        for i in range(30):
            interlock_cycle(agent, i)
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for i in range(args.cycles):
            interlock_cycle(agent, i)
        profiler.stop()
        if isinstance(store, SqlSessionStore):
            store.close()
    print(profiler.output_text(unicode=False, color=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
