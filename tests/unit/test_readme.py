"""The README's examples run, in order, as a new user would paste them."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 3


def test_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in python_blocks():
            exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "{'done': 1}"
    assert lines[1] == "{'done': 1}"
    _task_id, attempt, current = lines[2].split()
    assert (attempt, current) == ("1", "1")
    assert lines[3:7] == ["cancelled", "requested", "user pressed stop", "2"]
    del lines[3:7]
    # Periodic tasks: a second scheduler finds the tick's task there.
    assert lines[3:5] == ["[True] [False]", "{'kind': 'usage'} True"]
    del lines[3:5]
    assert lines[3] == "False True True 1"
    assert lines[4] == "approved -> review"
    assert lines[5] == "refused: at least one stays on call"
    assert "created_once" in lines
