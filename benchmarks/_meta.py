"""Shared metadata for benchmark JSON: machine, versions, seed, git commit, command line, time.

Every benchmark writes through :func:`write_result` so each result file says what made it:
``benchmarks/results/<name>.json`` for a full run, ``benchmarks/results/_quick/<name>.json``
for ``--quick`` (ignored by git).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from certeval.storage import dumps

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
QUICK_DIR = RESULTS_DIR / "_quick"


_DISTRIBUTIONS = {"sklearn": "scikit-learn"}  # import name -> the name pip installed it under


def _version(module: str) -> str | None:
    """The installed version, read from the package's metadata: importing torch, Ray and Prefect only to ask took
    seconds of every benchmark's run. A module not installed as a distribution (this checkout) is imported."""
    try:
        return importlib.metadata.version(_DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except Exception:  # a missing optional package is reported as None, not an error
        return None


def git_commit() -> str | None:
    """HEAD commit of the checkout (with ``+dirty`` when benchmark-relevant files changed)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "certeval", "benchmarks"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
        changed = [ln for ln in dirty.stdout.splitlines() if "benchmarks/results" not in ln]
        return head.stdout.strip() + ("+dirty" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, Any]:
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "hostname_hash": abs(hash(platform.node())) % 10_000,  # identifies "same box" without naming it
        "platform": platform.platform(),
        "processor": cpu_model or platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _command() -> str | None:
    """The command line as a person would type it (``python -m benchmarks.<name> ...``)."""
    if not sys.argv:
        return None
    first = Path(sys.argv[0])
    if first.suffix == ".py" and first.parent.name == "benchmarks":
        return " ".join(["python -m benchmarks." + first.stem, *sys.argv[1:]])
    return " ".join(["python", *sys.argv])


def metadata(name: str, *, seed: int | None, quick: bool) -> dict[str, Any]:
    return {
        "benchmark": name,
        "quick": bool(quick),
        "seed": seed,
        "git_commit": git_commit(),
        "command": _command(),
        "timestamp_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": {
            "python": platform.python_version(),
            **{m: _version(m) for m in ("numpy", "scipy", "pandas", "sklearn", "prefect", "ray", "torch",
                                          "transformers", "certeval")},
        },
    }


def result_path(name: str, quick: bool) -> Path:
    return (QUICK_DIR if quick else RESULTS_DIR) / f"{name}.json"


def write_result(name: str, payload: dict[str, Any], quick: bool, *, seed: int | None = None) -> Path:
    """Write ``{"meta": ..., **payload}`` atomically to the result path and return it."""
    path = result_path(name, quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": metadata(name, seed=seed if seed is not None else payload.get("seed"), quick=quick),
           **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(dumps(doc, indent=1) + b"\n")  # certeval's one JSON encoder: NaN -> null, numpy -> Python
    os.replace(tmp, path)
    return path


def read_result(name: str, quick: bool = False) -> dict[str, Any] | None:
    """The stored result of a benchmark, or None when it has not been run."""
    path = result_path(name, quick)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def tree_cpu_s(root: int, *, reaped: bool = False) -> float:
    """CPU seconds (user + system) of ``root`` and every live descendant, from /proc (0 elsewhere); ``reaped``: with
    the CPU of the children each has already waited for (cutime, cstime)."""
    if not os.path.isdir("/proc"):
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    last = 15 if reaped else 13  # fields 11-12: utime, stime; 13-14: cutime, cstime
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += sum(int(x) for x in stats[pid][11:last]) / tick
        todo.extend(children.get(pid, []))
    return total

