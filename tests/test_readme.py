"""The README's Python examples run as written, on the scripted model (the one change:
`googleai/gemini-flash-latest` needs a key and the network)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_python_blocks_run_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3, "define the agent, run then resume, connect and stream"
    assert '"googleai/gemini-flash-latest"' in blocks[0]
    namespace: dict[str, Any] = {}
    for number, block in enumerate(blocks):
        code = block.replace('"googleai/gemini-flash-latest"', '"scripted/banking"')
        exec(compile(code, f"README.md, Python block {number + 1}", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == ["Done: transferred $500.00 to savings, transaction txn-1."] * 2
