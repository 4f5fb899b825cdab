"""`import interlock` does not load SQLAlchemy: the in-memory store, the schemas and the
agents need none. `SqlSessionStore` is loaded on first use, by any of the ways a user
reaches it. Each check runs in a fresh interpreter, since this one has loaded
everything already."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_interlock_leaves_sqlalchemy_unloaded() -> None:
    code = (
        "import sys, interlock, interlock.stores.failures as f\n"
        "print('sqlalchemy' in sys.modules, f.first_line(ValueError('a\\nb')))\n"
    )
    assert _run(code) == "False a"


@pytest.mark.parametrize(
    "reach",
    [
        "from interlock import SqlSessionStore as S",
        "import interlock; S = interlock.SqlSessionStore",
        "from interlock.stores import SqlSessionStore as S",
        "from interlock import *; S = SqlSessionStore",
    ],
)
def test_sql_session_store_is_loaded_on_first_use(reach: str) -> None:
    code = (
        "import sys\n"
        f"{reach}\n"
        "from interlock.stores.sql import SqlSessionStore\n"
        "print(S is SqlSessionStore, 'sqlalchemy' in sys.modules)\n"
    )
    assert _run(code) == "True True"


def test_a_name_interlock_lacks_is_still_an_attribute_error() -> None:
    import interlock
    import interlock.stores

    for module in (interlock, interlock.stores):
        with pytest.raises(AttributeError, match=r"has no attribute 'SqlStore'"):
            _ = module.SqlStore


def test_a_store_failure_is_still_told_from_the_turns_own_error() -> None:
    from sqlalchemy.exc import IntegrityError, OperationalError

    from interlock.stores.failures import is_store_failure

    assert is_store_failure(OperationalError("SELECT 1", {}, Exception("connection refused")))
    assert not is_store_failure(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_store_failure(ValueError("no"))
