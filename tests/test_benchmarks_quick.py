"""`python -m benchmarks all --quick` runs every benchmark in this checkout and writes JSON with metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "benchmarks" / "results" / "_quick"
MINE = ("efficiency", "overhead", "scale")
# benchmarks whose --quick run has a test of its own (test_state_size_quick_... below, test_fast_start.py), or
# whose --quick run takes many minutes (live: lm-eval and certeval on SmolLM2; its building blocks are tested in
# test_benchmark_live.py; throughput: lm-eval's HFLM and certeval's hf host on SmolLM2): the all-quick test skips them
# rather than running them; gpu_pipeline: its --quick run starts Ray and Prefect twice (a certify and a compare
# command, ~45 CPU-seconds): its pieces are tested below, the run itself by hand and on a GPU machine
OWN_TESTS = ("state_size", "startup", "live", "throughput", "gpu_pipeline")


def test_runner_lists_benchmarks_and_rejects_unknown_names():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "efficiency" in out.stdout and "overhead" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "no-such-benchmark"], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown benchmark" in bad.stderr
    skip = subprocess.run([sys.executable, "-m", "benchmarks", "all", "--skip", "startup,nope", "--quick"], cwd=ROOT,
                          capture_output=True, text=True)
    assert skip.returncode == 2 and "nope" in skip.stderr and "==" not in skip.stdout  # refused before any run


def test_write_result_records_metadata(tmp_path, monkeypatch):
    from benchmarks import _meta

    monkeypatch.setattr(_meta, "QUICK_DIR", tmp_path)
    path = _meta.write_result("probe", {"x": float("nan"), "y": [1, 2]}, quick=True, seed=5)
    doc = json.loads(path.read_text())  # strict JSON: NaN became null
    assert doc["x"] is None and doc["y"] == [1, 2]
    meta = doc["meta"]
    assert meta["seed"] == 5 and meta["quick"] is True
    assert meta["machine"]["cpu_count"] >= 1
    for pkg in ("python", "numpy", "scipy", "prefect", "ray"):
        assert meta["versions"][pkg]
    assert meta["git_commit"] is None or len(meta["git_commit"].split("+")[0]) == 40


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_all_quick_runs_every_benchmark():
    # one thread per library: the suite runs two test workers on two cores, and oversubscribed torch / BLAS
    # threads spin (the gpu benchmark's quick run took 7 minutes instead of one beside the other worker)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = {p: p.stat().st_mtime for p in QUICK.glob("*.json")} if QUICK.is_dir() else {}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "all", "--skip", ",".join(OWN_TESTS), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2300)  # within the test's own 2400 s: a loaded box
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = {line.split(":")[0][3:] for line in proc.stdout.splitlines() if line.startswith("== ") and " exit " in line}
    assert "efficiency" in ran and "frontier" in ran and not ran & set(OWN_TESTS), sorted(ran)
    for name in MINE:
        path = QUICK / f"{name}.json"
        assert path.is_file() and path.stat().st_mtime > started.get(path, 0), name
        doc = json.loads(path.read_text())
        assert doc["meta"]["quick"] is True and doc["meta"]["versions"]["numpy"]
    eff = json.loads((QUICK / "efficiency.json").read_text())
    assert {c["dataset"] for c in eff["cells"]} >= {"helm_mmlu", "openllm_tiny", "opencompass_large"}
    assert all(c["reps"] > 0 for c in eff["cells"] if c["method"] in ("uniform", "adaptive", "seq", "static"))
    over = json.loads((QUICK / "overhead.json").read_text())
    assert over["scaling_fit"]["uniform"]["exponent"] is not None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_state_size_quick_keeps_every_state_within_50_kB(tmp_path):
    """Every single-model method on helm_mmlu with 384-d embeddings: the state written per round is at most
    50 kB (it was megabytes with the embeddings inline), and the stored state rebuilds the same result."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "state_size", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((QUICK / "state_size.json").read_text())
    assert doc["meta"]["quick"] is True and doc["within_limit"] and doc["after_bytes_max"] <= 50_000
    cells = {c["method"]: c for c in doc["cells"]}
    assert set(cells) >= {"uniform", "static", "seq", "cer-eval", "adaptive", "history"}
    for cell in cells.values():
        assert cell["n_scored"] == doc["n_items"] and cell["rounds"] >= 3
        assert cell["before_bytes_max"] > 4_000_000 > 50_000 >= cell["after_bytes_max"]
        assert cell["features_files"] >= 1 and cell["resumed_state_same_result"]


def test_gpu_pipeline_bank_and_agreement_check(tmp_path):
    """The GPU benchmark's synthetic bank is seeded and well-formed; its per-item agreement check passes identical
    log-likelihoods and catches a changed choice and a log-likelihood off by more than the dtype's tolerance."""
    from benchmarks.gpu_pipeline import agreement, read_timeline, synthetic_mc_items

    items = synthetic_mc_items(50, seed=3)
    assert items == synthetic_mc_items(50, seed=3) and items != synthetic_mc_items(50, seed=4)
    assert all(len(set(it["choices"])) == 4 and 0 <= it["answer"] < 4 for it in items)
    assert len({it["item_id"] for it in items}) == 50
    bare = {"a": [-3.0, -1.0, -2.0, -4.0], "b": [-10.0, -12.0, -11.0, -9.0]}
    same = agreement({k: list(v) for k, v in bare.items()}, bare, "bfloat16")
    assert same["items"] == 2 and same["same_choice_fraction"] == 1.0 and same["within_tolerance_fraction"] == 1.0
    swapped = agreement({"a": [-1.0, -3.0, -2.0, -4.0], "b": bare["b"]}, bare, "bfloat16")  # broken control
    assert swapped["same_choice_fraction"] == 0.5 and swapped["within_tolerance_fraction"] == 0.5
    off = agreement({"a": bare["a"], "b": [-10.0, -12.0, -11.0, -9.5]}, bare, "float32")  # 0.5 of 9: over 1e-3
    assert off["same_choice_fraction"] == 1.0 and off["within_tolerance_fraction"] == 0.5
    timeline = tmp_path / "t.log"
    timeline.write_text("first_call\t10.5\t7\nmodel_loaded\t9.0\t7\nmodel_loaded\t9.5\t8\nbroken line\n")
    assert read_timeline(timeline) == {"first_call": [10.5], "model_loaded": [9.0, 9.5]}


def test_gpu_pipeline_table_names_a_failed_command():
    from benchmarks.gpu_pipeline import summary_table

    run = {"items_per_s": 500.0, "pipeline_over_bare_items_per_s": 1.2, "gpu_busy_fraction": {"rounds": 0.4},
           "phases": {"startup_s": 12.0, "model_load_s": 4.0, "rounds_s": 1.0},
           "agreement_first_model": {"same_choice_fraction": 1.0, "within_tolerance_fraction": 0.999}}
    doc = {"device_name": "GPU", "model": "m", "dtype": "bfloat16", "n_items": 2000, "batch": 64, "look_items": 256,
           "bare_transformers": {"items_per_s": 400.0, "seconds": 5.0}, "host": {"items_per_s": 600.0, "seconds": 3.3},
           "host_over_bare_items_per_s": 1.5, "phases_here": {"bare": {"gpu_busy_fraction": 0.2},
                                                              "host": {"gpu_busy_fraction": None}},
           "certify": run, "compare": {"error": "RuntimeError: certeval compare exited 2; see the log"}}
    table = summary_table(doc)
    assert "certify" in table and "1.20" in table and "0.999" in table
    assert "compare    FAILED: RuntimeError: certeval compare exited 2" in table


def test_device_unpack_adds_a_fallback_only_where_the_machine_misses_a_requirement():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_unpack", ROOT / "benchmarks" / "device" / "unpack.py")
    unpack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unpack)
    assert unpack.unmet("packaging", [">=20 (ray)"]) is None
    assert "misses <1 (prefect)" in unpack.unmet("packaging", [">=20 (ray)", "<1 (prefect)"])
    assert unpack.unmet("no-such-package-here", []) == "not installed"
