"""Benchmark runner: ``python -m benchmarks all [--skip A,B] [--quick]`` or ``python -m benchmarks NAME [--quick]``.

A benchmark is a module ``benchmarks/<name>.py`` exposing ``main(argv) -> int`` (each
parses its own ``--quick`` / ``--seed``). ``all`` runs every one present in this checkout
(but those named by ``--skip``), in a fixed order, each in its own process so one failing or
leaking benchmark cannot poison the next; the runner's exit code is non-zero if any failed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Order: cheap and independent first; readme tables last (they read the others' JSON).
ORDER = ("efficiency", "overhead", "state_size", "startup", "pairwise", "faq", "synthetic_cereval", "synthetic_adaptive",
         "scale", "gpu")
NOT_BENCHMARKS = {"__init__", "__main__", "_meta", "readme_tables"}


def available() -> list[str]:
    present = {p.stem for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_")}
    ordered = [n for n in ORDER if n in present]
    return ordered + sorted(present - set(ordered))


def _has_main(name: str) -> bool:
    spec = importlib.util.spec_from_file_location(f"benchmarks.{name}", HERE / f"{name}.py")
    text = (HERE / f"{name}.py").read_text()
    return spec is not None and ("def main(" in text or "__main__" in text)


def run_one(name: str, extra: list[str]) -> int:
    """Run one benchmark in a fresh interpreter (``python -m benchmarks.<name> ...``)."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *extra]
    t0 = time.perf_counter()
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    rc = subprocess.call(cmd, cwd=HERE.parent)
    print(f"== {name}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("benchmarks here:", ", ".join(names))
        return 0 if argv else 2
    target, extra = argv[0], argv[1:]
    if target == "all":
        skip: set[str] = set()
        if extra[:1] == ["--skip"]:
            skip, extra = set(filter(None, (extra[1] if len(extra) > 1 else "").split(","))), extra[2:]
            unknown = sorted(skip - set(names)) or ([] if skip else ["(none given)"])
            if unknown:
                print(f"--skip names no benchmark here: {', '.join(unknown)}; here: {', '.join(names)}",
                      file=sys.stderr)
                return 2
        failed = [n for n in names if n not in skip and _has_main(n) and run_one(n, extra) != 0]
        if "readme_tables" not in extra and (HERE / "readme_tables.py").is_file() and "--quick" not in extra:
            run_one("readme_tables", [])
        if failed:
            print("failed:", ", ".join(failed), file=sys.stderr)
            return 1
        return 0
    if target not in names and target != "readme_tables":
        print(f"unknown benchmark {target!r}; here: {', '.join(names)}", file=sys.stderr)
        return 2
    return run_one(target, extra)


if __name__ == "__main__":
    sys.exit(main())
