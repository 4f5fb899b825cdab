"""Imports flow one way: `schemas` <- `interlock` <- `events` <- `workers`. `schemas`
imports nothing of ours, `interlock` only `schemas` (and no Celery, no kombu: agents
run in process without a broker), `events` knows `schemas` only (the store it shares a
database with is a structural type, `events.store.SqlStore`), and `workers` may use
them all (and the banking example, for `interlock demo`). Every import counts, those
inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"schemas", "interlock", "events", "workers", "examples", "bench", "tests"}
ALLOWED = {
    "schemas": set(),
    "interlock": {"schemas"},
    "events": {"schemas"},
    "workers": {"schemas", "interlock", "events", "examples"},
    "examples": {"schemas", "interlock"},
}
FORBIDDEN_THIRD_PARTY = {"interlock": {"celery", "kombu", "billiard"}, "events": {"celery"}}


def imported(source: str) -> set[str]:
    """The top-level names of every absolute import in `source`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def wrong_imports(package: str, source: str) -> set[str]:
    """What `source`, a module of `package`, imports that the layering forbids."""
    names = imported(source) - {package}
    return (names & OURS - ALLOWED[package]) | (names & FORBIDDEN_THIRD_PARTY.get(package, set()))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_flow_one_way(package: str) -> None:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"no modules found under {package}/"
    wrong = {
        str(path.relative_to(ROOT)): sorted(found)
        for path in modules
        if (found := wrong_imports(package, path.read_text(encoding="utf-8")))
    }
    assert wrong == {}, f"imports against the layering: {wrong}"


def test_the_check_sees_lazy_and_dotted_imports() -> None:
    source = "import json\ndef f():\n    from interlock.stores.fast import FastStatement\n"
    assert wrong_imports("events", source) == {"interlock"}
    assert wrong_imports("interlock", "import kombu.messaging\nfrom schemas import Part") == {
        "kombu"
    }
    assert wrong_imports("schemas", "from . import part\nimport pydantic") == set()
    assert wrong_imports("workers", "from events.outbox import Outbox") == set()


def test_tests_mirror_the_packages() -> None:
    """tests/ has one package per package of ours that it tests, and tests of the four
    layers live in theirs; only tests of the project as a whole (compose, packaging, the
    README, the public API's static types, this one) sit at the top."""
    tests = ROOT / "tests"
    packages = {p.name for p in tests.iterdir() if (p / "__init__.py").is_file()}
    assert {"schemas", "interlock", "events", "workers"} <= packages <= OURS - {"tests"}
    for name in packages:
        assert sorted((tests / name).glob("test_*.py")), f"tests/{name}/ holds no tests"
    top = {p.name for p in tests.glob("test_*.py")}
    assert top == {
        "test_api_types.py",
        "test_compose.py",
        "test_layering.py",
        "test_packaging.py",
        "test_readme.py",
    }
