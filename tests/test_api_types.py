"""The public API's static types, as a user's `mypy --strict` sees them: mypy checks
tests/api_types.py (its `assert_type`s and the errors its ignores expect) with the
project's settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mypy(target: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_public_api_types_a_users_code(tmp_path: Path) -> None:
    done = _mypy(ROOT / "tests" / "api_types.py", tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found in 1 source file"), done.stdout

    # The same check meets a type the API does not give: it is no check that always passes.
    wrong = tmp_path / "wrong_types.py"
    wrong.write_text(
        "from typing import Any, assert_type\n"
        "from interlock import Tool\n"
        "from tests.api_types import lookup\n"
        "assert_type(lookup, Tool[Any, Any])\n"
    )
    failed = _mypy(wrong, tmp_path / "cache")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert 'Expression is of type "Tool[Ask, Done]", not "Tool[Any, Any]"' in failed.stdout
