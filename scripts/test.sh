#!/usr/bin/env bash
# README command 2: install (if needed) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Test-only: llama-cpp-python serves the small GGUF model as a real OpenAI-compatible server for the openai
# backend test. It compiles from source (minutes, once; pip caches the wheel), so the main install skips it.
if ! .venv/bin/python -c "import llama_cpp.server" >/dev/null 2>&1; then
  .venv/bin/pip install -q "llama-cpp-python[server]==0.3.36" \
    || echo "warning: llama-cpp-python did not build; the openai-backend server test will be skipped" >&2
fi
export CERTEVAL_CACHE="${CERTEVAL_CACHE:-$PWD/.cache/certeval}"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for us, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
