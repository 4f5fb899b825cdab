"""What the CLI, the workers and the runtime import comes from the distribution's own
requirements (no extras of ours): `pip install interlock` alone gives a working
`interlock`. A child process imports everything with every other installed
distribution hidden; an optional import (`try: import yaml`) may fail there, a needed
one fails the test."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

from packaging.requirements import Requirement

CHILD = """
import json, sys

class Hidden:
    blocked = set(json.loads(sys.argv[1]))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not required)", name=name)
        return None

sys.meta_path.insert(0, Hidden())
import interlock, schemas, workers.cli, workers.app, workers.consumer, workers.demo
import events.outbox, events.publisher, events.stream, examples.banking
import kombu.transport.redis, kombu.transport.pyamqp, kombu.transport.memory
import celery.worker, celery.apps.worker
import sqlalchemy.dialects.postgresql.psycopg, sqlalchemy.dialects.sqlite, psycopg
workers.cli.main(["--help"], standalone_mode=False)
"""


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _closure(name: str) -> set[str]:
    """The distributions `name` requires, transitively, with the extras asked for on
    the way (names normalized)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset())]
    while todo:
        current, extras = todo.pop()
        if (current, extras) in seen:
            continue
        seen.add((current, extras))
        names.add(current)
        try:
            requires = distribution(current).requires or []
        except PackageNotFoundError:
            continue  # a requirement for another platform
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
                todo.append((_norm(requirement.name), frozenset(requirement.extras)))
    return names


def test_everything_imports_with_only_the_required_distributions() -> None:
    required = _closure("interlock")
    assert "packaging" in required, "kombu's redis transport imports it (kombu[redis])"
    blocked = sorted(
        module
        for module, owners in packages_distributions().items()
        if not {_norm(owner) for owner in owners} & required
    )
    assert "pytest" in blocked and "kombu" not in blocked
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(blocked)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout
