"""The generated sync face matches its asyncio source (no drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sync_face_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_generated_files_say_do_not_edit() -> None:
    for path in (ROOT / "src" / "agentlease" / "_sync").glob("*.py"):
        if path.name != "__init__.py":
            assert "DO NOT EDIT" in path.read_text().splitlines()[0]
