#!/usr/bin/env bash
# README command 2: install (if needed) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# the converted SmolLM2 stays in the checkout (.cache/certeval): certeval's default cache folder follows
# XDG_CACHE_HOME (other tools' caches move there too, all ignored by git)
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/.cache}"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
