#!/usr/bin/env bash
# One call on a GPU machine: unpack the bundle, then the whole pipeline beside the bare loop (benchmarks/gpu_pipeline.py).
#
#   bash benchmarks/device/gpu_pipeline.sh [--check-only | BENCHMARK FLAGS...]
#
# Needs .device-bundle/site-cp312.tar.xz (python benchmarks/device/bundle.py, run where PyPI answers) in the tree.
# Writes gpu_pipeline.json, gpu_pipeline.log, commands.log (the certeval commands' own output) and the two start-up
# timelines under $OUT (default /tmp/gpu-pipeline-out) and prints the summary table last. --check-only: imports
# and a local Ray's resources only (about a minute). Env: PYTHON (default python3), CERTEVAL_DEVICE_BUNDLE.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/gpu-pipeline-out}
PY=${PYTHON:-python3}
BUNDLE=${CERTEVAL_DEVICE_BUNDLE:-.device-bundle/site-cp312.tar.xz}
SITE=/tmp/certeval-site
WORK=/tmp/certeval-gpu-work
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

run() {
    "$PY" benchmarks/device/unpack.py "$BUNDLE" "$SITE" || return 2
    export PYTHONPATH="$PWD:$SITE/site" CERTEVAL_MODEL_CONFIG="$SITE/model" XDG_CACHE_HOME=/tmp/certeval-cache
    "$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    if [ "${1:-}" = "--check-only" ]; then
        "$PY" -m benchmarks.gpu_pipeline --check-only
        return $?
    fi
    rm -rf "$WORK"
    "$PY" -m benchmarks gpu_pipeline --workdir "$WORK" --command-timeout 240 "$@"
}

SECONDS=0
stamp=$(mktemp)  # only results written by this run are copied (benchmarks/results/gpu_pipeline.json is committed)
run "$@" 2>&1 | tee "$OUT/gpu_pipeline.log"
rc=${PIPESTATUS[0]}
if [ "${1:-}" != "--check-only" ]; then
    for f in $(find benchmarks/results -maxdepth 2 -name 'gpu_pipeline*.json' -newer "$stamp") \
             "$WORK/commands.log" "$WORK/certify.timeline" "$WORK/compare.timeline"; do
        [ -f "$f" ] && cp "$f" "$OUT/"
    done
    [ "$rc" != 0 ] && tail -40 "$WORK/commands.log" 2>/dev/null
    json=$(ls -t "$OUT"/gpu_pipeline*.json 2>/dev/null | head -1)  # exit 3: a command failed, the table says which
    [ -n "$json" ] && PYTHONPATH="$PWD" "$PY" -c \
        'import json, sys; from benchmarks.gpu_pipeline import summary_table; print(summary_table(json.load(open(sys.argv[1]))))' "$json"
fi
rm -f "$stamp"
echo "gpu_pipeline.sh: exit $rc after ${SECONDS} s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$rc"
