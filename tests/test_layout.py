"""Project-shape checks: estimators/ stays pure (numpy, scipy, scikit-learn, the standard library, and of certeval
only itself and ``certeval.errors``, the bottom layer: docs/architecture.md §2), the loopback guard works."""

from __future__ import annotations

import ast
import socket
import sys
from pathlib import Path

import pytest

ESTIMATORS = Path(__file__).resolve().parents[1] / "certeval" / "estimators"
ALLOWED_THIRD_PARTY = {"numpy", "scipy", "sklearn"}
ALLOWED_CERTEVAL = ("certeval.estimators", "certeval.errors")  # errors: InputError, raised by every layer


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 2 and path.parent.name != "estimators"):  # inside estimators/
                continue
            if node.level:  # reaching above estimators/: checked as the absolute name it stands for
                out.append(("certeval." + (node.module or ""), node.lineno))
                continue
            out.append((node.module or "", node.lineno))
    return out


def test_estimators_import_only_numpy_scipy_sklearn_and_stdlib():
    files = sorted(ESTIMATORS.rglob("*.py"))
    assert files, "estimators/ is empty"
    offenders = []
    for path in files:
        for name, line in _imports(path):
            top = name.split(".")[0]
            if top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names or top == "__future__":
                continue
            if name.startswith(ALLOWED_CERTEVAL):
                continue
            offenders.append(f"{path.relative_to(ESTIMATORS.parent)}:{line} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_purity_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pandas\nfrom ray import remote\nfrom . import ok\nimport numpy\n")
    names = [n for n, _ in _imports(bad)]
    assert names == ["pandas", "ray", "numpy"]


def test_loopback_guard_refuses_outside_addresses():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError, match="loopback"):
            s.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed
    finally:
        s.close()
