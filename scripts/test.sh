#!/usr/bin/env bash
# README command 2: install (if needed) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Test-only: llama-cpp-python serves the small GGUF model as a real OpenAI-compatible server for the openai
# backend test. It compiles from source (minutes, once), so the main install skips it. Portable build: with
# llama.cpp's default native tuning (-march=native) the server died with a general protection fault in
# libggml-cpu.so on its first completion on AVX-512/AMX Intel CPUs. GGML_NATIVE=OFF compiles ggml's generic
# x86-64 set (SSE4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512, no AMX). pip's wheel cache keys on name+version
# only, so the wheel is built without it into a folder named by a hash of (version, CMAKE_ARGS), and a stamp
# in the venv records which build is installed (and the sha256 of its libraries): a build with other flags,
# e.g. an earlier native one, is never reused silently but replaced from the cached portable wheel.
LLAMA_VERSION=0.3.36
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF"
LLAMA_KEY=$(printf 'llama-cpp-python==%s\nCMAKE_ARGS=%s\n' "$LLAMA_VERSION" "$LLAMA_CMAKE_ARGS" \
  | sha256sum | cut -c1-16)
LLAMA_WHEELS=".cache/wheels/llama-cpp-python-$LLAMA_VERSION-$LLAMA_KEY"
LLAMA_STAMP=".venv/.llama-cpp-build-$LLAMA_KEY"
# One sha256 over the installed native libraries (llama_cpp/lib/*.so*): the stamp names the files it vouches for.
llama_libs_sum() { sha256sum .venv/lib/python3*/site-packages/llama_cpp/lib/*.so* | sha256sum | cut -c1-64; }
# Called as an `if` condition, where set -e does not apply: every step ends in `|| return 1`.
install_llama_cpp() {
  local wheel sum
  wheel=$(find "$LLAMA_WHEELS" -maxdepth 1 -name "llama_cpp_python-$LLAMA_VERSION-*.whl" 2>/dev/null | head -n 1) \
    || wheel=""
  if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $LLAMA_VERSION from source with CMAKE_ARGS=\"$LLAMA_CMAKE_ARGS\"" \
      "(once, minutes; log: $LLAMA_WHEELS.log)" >&2
    mkdir -p .cache/wheels && rm -rf "$LLAMA_WHEELS.partial" || return 1
    # --no-binary: never take a prebuilt wheel from an index or find-links; SKBUILD_CMAKE_*: no flags from outside.
    env -u SKBUILD_CMAKE_ARGS -u SKBUILD_CMAKE_DEFINE CMAKE_ARGS="$LLAMA_CMAKE_ARGS" \
      .venv/bin/pip wheel -v --no-cache-dir --no-deps --no-binary llama-cpp-python -w "$LLAMA_WHEELS.partial" \
      "llama-cpp-python==$LLAMA_VERSION" >"$LLAMA_WHEELS.log" 2>&1 \
      || { tail -n 20 "$LLAMA_WHEELS.log" >&2; return 1; }
    rm -rf "$LLAMA_WHEELS" && mv "$LLAMA_WHEELS.partial" "$LLAMA_WHEELS" || return 1
    wheel=$(find "$LLAMA_WHEELS" -maxdepth 1 -name "llama_cpp_python-$LLAMA_VERSION-*.whl" | head -n 1) || return 1
    [ -n "$wheel" ] || return 1
  else
    echo "installing the cached portable llama-cpp-python wheel $wheel" >&2
  fi
  # llama-cpp-python itself only from that wheel (replacing any other build); then its own and the server
  # extra's dependencies (uvicorn, fastapi, sse-starlette, ...) from the index, never moving a pinned package.
  .venv/bin/pip install -q --no-index --no-deps --force-reinstall "$wheel" || return 1
  .venv/bin/pip install -q -c requirements.lock "$wheel[server]" || return 1
  .venv/bin/python -c "import llama_cpp.server" || return 1
  sum=$(llama_libs_sum) && [ -n "$sum" ] || return 1
  rm -f .venv/.llama-cpp-build-* || return 1
  printf 'llama-cpp-python==%s\nCMAKE_ARGS=%s\nwheel=%s\nllama_cpp/lib sha256=%s\n' "$LLAMA_VERSION" \
    "$LLAMA_CMAKE_ARGS" "$wheel" "$sum" >"$LLAMA_STAMP" || return 1
}
if [ -f "$LLAMA_STAMP" ] && grep -qxF "llama_cpp/lib sha256=$(llama_libs_sum 2>/dev/null)" "$LLAMA_STAMP" \
    && .venv/bin/python -c "import llama_cpp.server" >/dev/null 2>&1; then
  :  # the portable build for these flags is installed
else
  if .venv/bin/python -c "import llama_cpp" >/dev/null 2>&1; then
    echo "llama-cpp-python in .venv is not the build for CMAKE_ARGS=\"$LLAMA_CMAKE_ARGS\" (no matching stamp" \
      "$LLAMA_STAMP): replacing it" >&2
  fi
  if ! install_llama_cpp; then
    echo "warning: llama-cpp-python $LLAMA_VERSION (CMAKE_ARGS=\"$LLAMA_CMAKE_ARGS\") did not build or install;" \
      "the openai-backend server test will be skipped (log: $LLAMA_WHEELS.log)" >&2
    rm -f .venv/.llama-cpp-build-*
    # never test against another build (e.g. an earlier -march=native one) in its place
    if .venv/bin/python -c "import llama_cpp" >/dev/null 2>&1; then
      .venv/bin/pip uninstall -q -y llama-cpp-python >&2 || true
    fi
    export CERTEVAL_LLAMA_BUILD_LOG="$PWD/$LLAMA_WHEELS.log"
  fi
fi
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
