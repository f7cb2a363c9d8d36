#!/usr/bin/env bash
# README command 2: install (if needed) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# the converted SmolLM2 stays in the checkout (.cache/certeval): certeval's default cache folder follows
# XDG_CACHE_HOME (other tools' caches move there too, all ignored by git)
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/.cache}"
# convert SmolLM2's GGUF once here (15-70 s the first time, a no-op after), not inside two test workers at once
.venv/bin/python -c "from certeval.inputs.smollm import ensure_converted; ensure_converted()"
# three workers, whole files each (module fixtures stay in one process), in collection order: the longest files first
# (tests/conftest.py; xdist's default would start the files with the most tests first). Most tests wait on servers
# and subprocesses: two workers kept 2 cores 71% busy, three keep them busier. -n 0 (or -p no:xdist) runs in one
# process, to debug. --durations: the slowest tests, for whoever trims the suite next (the suite is CPU-bound:
# scripts/suite_cpu_profile.py gives CPU seconds per test).
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 -n 3 --dist loadfile --no-loadscope-reorder --durations=15 "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
