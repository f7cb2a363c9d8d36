"""The code passes ruff with the repository's configuration (``[tool.ruff]`` in pyproject.toml; ruff pinned in
requirements.lock): ``python -m ruff check certeval tests benchmarks`` exits 0. ``ruff check --fix`` applies the
mechanical fixes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "certeval", "tests", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"
