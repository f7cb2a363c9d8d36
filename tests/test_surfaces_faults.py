"""Faults on the new paths (issue 48, class 5).

* A corrupted score-cache part is detected and its items scored again, never read as scores: the round loop runs
  in this process with a counting stand-in for the model, over a cache whose second part is damaged one way per
  case (bytes changed after it was written, truncated, empty, out-of-range / NaN / text scores, a column missing,
  a folder in its place). Fast.
* A full disk or a read-only output folder: one line, exit 3 or 2, nothing half-written (the commands run in a
  private mount namespace over a tiny tmpfs; the folder is listed inside it after the command). Skipped where no
  such namespace can be made.
* Slow (Ray and Prefect): SIGTERM while ``select --checkpoints`` starts its model actors ends within a minute in
  one line (exit 143) and the same command resumes; a ``--tasks`` run SIGKILLed mid-run and resumed asks the model
  for no item twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from surface_table_support import children, no_new_children

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 8


# -- corrupted score-cache parts, through the round loop ---------------------------------------------------------


class CountingOutputs:
    """The model: answers every item right ('a'), counting what it was asked."""

    def __init__(self) -> None:
        from certeval.reports.rescore import RecordedOutputs
        from certeval.scoring import scorers as sc

        self.asked: list[str] = []
        self.inner = RecordedOutputs({}, sc.get_scorer("exact"))
        self.stats = self.inner.stats

    def score(self, requests, batch_size, on_result=None):
        for label, pairs in requests.items():
            for _, item in pairs:
                self.asked.append(str(item["item_id"]))
                self.inner.outputs[(label, str(item["item_id"]))] = "a"
        return self.inner.score(requests, batch_size, on_result)


def _plan(root: Path, bank: str, model_dir: Path):
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    return make_plan(Certify(models=[f"hf:{model_dir}"], bank=bank, goal="halfwidth:0.01",
                                 method="uniform", batch_size=4, scorer="exact", output=str(root), run_id="r"))


def _rewrite_keep_name(path: Path, frame: pd.DataFrame) -> None:
    path.write_bytes(frame.assign(score=0.9).to_parquet(index=False))  # a valid Parquet file, other bytes


def _crafted(folder, frame: pd.DataFrame, **column) -> None:
    """A part written as certeval writes one (its digest right) but holding what is not a score."""
    from certeval.storage.cache import write_part

    write_part(folder, frame.assign(**column) if column else frame)


def _flip(path: Path, frame: pd.DataFrame) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# (case id, damage(path of the part, its frame, the shared folder) -> None: the part is replaced or changed)
DAMAGE = [
    ("bytes-changed-after-writing", lambda p, f, folder: _rewrite_keep_name(p, f)),
    ("one-bit-flipped", lambda p, f, folder: _flip(p, f)),
    ("truncated", lambda p, f, folder: p.write_bytes(p.read_bytes()[:40])),
    ("empty-file", lambda p, f, folder: p.write_bytes(b"")),
    ("score-out-of-range", lambda p, f, folder: (p.unlink(), _crafted(folder, f, score=7.0))),
    ("score-nan", lambda p, f, folder: (p.unlink(), _crafted(folder, f, score=float("nan")))),
    ("score-negative", lambda p, f, folder: (p.unlink(), _crafted(folder, f, score=-0.5))),
    ("score-text", lambda p, f, folder: (p.unlink(), _crafted(folder, f, score="high"))),
    ("no-item-key-column", lambda p, f, folder: (p.unlink(), _crafted(folder, f.drop(columns="item_key")))),
    ("null-item-key", lambda p, f, folder: (p.unlink(), _crafted(folder, f, item_key=None))),
    ("a-folder-in-its-place", lambda p, f, folder: (p.unlink(), p.mkdir())),
    ("older-name-out-of-range", lambda p, f, folder: (p.unlink(), (p.parent / ("0" * 32 + ".parquet")).write_bytes(
        f.assign(score=3.0).to_parquet(index=False)))),
]


@pytest.fixture(scope="module")
def cache_fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache")
    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    bank = d / "bank.jsonl"
    bank.write_text("".join(json.dumps({"item_id": f"t/{i}", "question": f"q{i}", "answer": "a"}) + "\n"
                            for i in range(N_ITEMS)))
    return d, str(bank), model


@pytest.mark.parametrize("case_id,damage", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_a_corrupted_cache_part_is_scored_again_never_read(case_id, damage, cache_fx, tmp_path):
    from certeval.engine import play
    from certeval.runs.round_steps import RunSteps
    from certeval.runs.run import Run

    _, bank, model = cache_fx
    plan, prepared = _plan(tmp_path, bank, model)
    probe = Run.open(plan, prepared)  # the items' cache keys, as the run computes them
    try:
        keys = list(probe.keys)
        cache = probe.caches[plan.labels[0]]
    finally:
        probe.store.release_lock()
    half = N_ITEMS // 2
    rows = [{"item_key": k, "item_id": f"t/{i}", "score": 0.0, "tokens": 1, "latency_s": 0.0, "output": "x"}
            for i, k in enumerate(keys)]
    cache.add(rows[:half])  # intact: these items are never asked again (scored 0 by the cache)
    parts = set((tmp_path / "_cache" / "_shared" / "parts").iterdir())
    cache.add(rows[half:])
    (damaged,) = set((tmp_path / "_cache" / "_shared" / "parts").iterdir()) - parts
    frame = pd.read_parquet(damaged)
    damage(damaged, frame, cache.shared)

    procs = children()
    pool = CountingOutputs()
    run = Run.open(plan, prepared)
    try:
        run.embed()
        run.restore()
        play(RunSteps(run, pool))
        result = run.results()
    finally:
        if run.owns_lock:
            run.store.release_lock()
    assert sorted(pool.asked) == [f"t/{i}" for i in range(half, N_ITEMS)], (case_id, pool.asked)
    rounds = pd.concat([pd.read_parquet(p) for p in sorted((tmp_path / "r" / "rounds").glob("*.parquet"))])
    got = dict(zip(rounds["item_id"], rounds["score"]))
    assert got == {f"t/{i}": (0.0 if i < half else 1.0) for i in range(N_ITEMS)}, (case_id, got)
    assert result["models"][0]["n_scored"] == N_ITEMS and len(rounds) == N_ITEMS
    assert not no_new_children(procs)


# -- a full disk, a read-only folder --------------------------------------------------------------------------


def _namespace_runner() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                           capture_output=True, text=True, timeout=60)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def disk_fx(tmp_path_factory):
    if not _namespace_runner():
        pytest.skip("no private mount namespace here (needs root and unshare -m)")
    from test_readers import write_samples

    d = tmp_path_factory.mktemp("disk")
    samples = write_samples(d / "lm", "org__model", "arc_easy", [1.0, 0.0] * 400)
    long = Path(write_samples(d / "lm-long", "org__model", "arc_easy", [1.0] * 200))
    records = [json.loads(line) for line in long.read_text().splitlines()]
    for rec in records:  # long questions: the items file outgrows the disk
        rec["doc"]["question"] = "x" * 2000
    long.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    run = d / "runs" / "plain"
    from test_surfaces_no_code import _bank, _scoring, _stored_run

    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _stored_run(d / "runs", "plain", _bank(d / "plain.bank.jsonl", _scoring()), model)
    return {"samples": samples, "long": str(long), "run": str(run), "root": str(d)}


def _in_namespace(argv: list[str], mount: Path, listing: Path, *, size: str = "48k", read_only: bool = False,
                  cwd: Path) -> subprocess.CompletedProcess:
    """``certeval ARGV`` with ``mount`` a tiny (or read-only) tmpfs in a private mount namespace; what the mount
    holds afterwards is written to ``listing``."""
    mount.mkdir(exist_ok=True)
    opts = "ro" if read_only else f"size={size}"
    script = (f'mount -t tmpfs -o {opts} none "{mount}" || exit 99; "$@"; rc=$?; '
              f'find "{mount}" -mindepth 1 > "{listing}"; exit $rc')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(cwd), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "certeval", *argv],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# (case id, argv builder given (fixtures, mount), tmpfs read-only?, allowed exits, a word of the line)
DISK_CASES = [
    ("import-onto-a-full-disk", lambda fx, m: ["import", "lm-eval", fx["long"], "-o", f"{m}/sub/scores.jsonl",
                                               "--items", f"{m}/sub/items.jsonl"], False, (2, 3), "space"),
    ("import-onto-a-read-only-folder", lambda fx, m: ["import", "lm-eval", fx["samples"], "-o",
                                                      f"{m}/scores.parquet"], True, (2,), "not writable"),
    ("rescore-onto-a-full-disk", lambda fx, m: ["rescore", fx["run"], "--scorer", "normalized", "--output", str(m)],
     False, (2, 3), "space"),
    ("rescore-onto-a-read-only-folder", lambda fx, m: ["rescore", fx["run"], "--scorer", "normalized", "--output",
                                                       str(m)], True, (2, 3), "not writable"),
]


@pytest.mark.slow  # the CLI in a subprocess, in a private mount namespace (docs/testing.md)
@pytest.mark.parametrize("case_id,build,read_only,wants,word", DISK_CASES, ids=[c[0] for c in DISK_CASES])
def test_a_full_disk_or_read_only_folder_is_one_line_and_nothing_half_written(case_id, build, read_only, wants, word,
                                                                              disk_fx, tmp_path):
    mount, listing = tmp_path / "mnt", tmp_path / "listing.txt"
    size = "24k" if case_id.startswith("rescore") else "48k"
    proc = _in_namespace(build(disk_fx, mount), mount, listing, read_only=read_only, size=size, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode in wants and len(lines) == 1, (case_id, proc.returncode, proc.stderr[-2000:])
    assert word.lower() in lines[0].lower(), (case_id, lines[0])
    assert "Traceback" not in proc.stderr
    assert listing.read_text().strip() == "", f"{case_id}: left {listing.read_text()}"
    left = [p.name for p in tmp_path.iterdir() if p.name not in ("mnt", "listing.txt")]
    assert left == [], f"{case_id}: wrote {left}"


# -- slow: SIGTERM while checkpoint actors start; a --tasks run killed and resumed --------------------------------


def _user_env(home: Path, short_tmp: str) -> dict[str, str]:
    """A user's shell with no Ray or Prefect of its own: the command starts both (Ray's files under short_tmp)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env.update(HOME=str(home), TMPDIR=short_tmp, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return env


def _left(*marks: str) -> list[int]:
    import psutil

    out = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        line = " ".join(proc.info["cmdline"] or [])
        if any(m in line for m in marks) or any(proc.info["cwd"] and proc.info["cwd"].startswith(m) for m in marks):
            out.append(proc.pid)
    return out


def _wait_gone(*marks: str, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = _left(*marks)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def _mc_bank(path: Path, n: int = 12) -> str:
    words = ["red", "blue", "green", "seven", "Paris", "water", "stone", "river", "apple", "north", "music", "glass"]
    path.write_text("".join(json.dumps({"item_id": f"q{i}", "question": f"Which word follows {words[i % 12]}?",
                                        "choices": [words[(i + k) % 12] for k in (1, 3, 5)], "answer": 0}) + "\n"
                            for i in range(n)))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("phase,delay_s", [("plan_ready", 1.0), ("prefect_launched", 6.0), ("ray_ready", 1.0)],
                         ids=["plan-checked", "inside-ray-init", "actors-starting"])
def test_sigterm_while_checkpoint_actors_start_ends_in_a_minute_and_resumes(phase, delay_s, tmp_path):
    """SIGTERM ``delay_s`` after the start-up reached ``phase``: the plan checked; inside ``ray.init`` (where Ray's
    own SIGTERM handler raised SystemExit(15): status 15, no word); Ray up and the checkpoint actors being created
    and loading their models. Exit 143 within a minute, one line, no process left, no round stored. In every phase
    the run folder is then the same (the plan written, the claim released, no round), so the resume that reruns the
    same command to its end (three actors on a fresh Ray and Prefect: most of the case's time) runs once, in the
    last phase's case."""
    from test_select_checkpoints import _checkpoints

    from test_pipeline_support import needs_small_lm

    needs_small_lm()
    from certeval.inputs.smollm import ensure_converted

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    _checkpoints(tmp_path / "train", ensure_converted())
    short_tmp = tempfile_dir()
    log = tmp_path / "startup.log"
    argv = [sys.executable, "-m", "certeval", "select", "--checkpoints", str(tmp_path / "train" / "ckpt-*"), "--bank",
            _mc_bank(tmp_path / "bank.jsonl"), "--num-cpus", "3", "--batch-size", "4", "--output",
            str(work / "runs"), "--run-id", "r", "--json", "--quiet"]
    env = _user_env(home, short_tmp)
    try:
        proc = subprocess.Popen([*argv, "--startup-log", str(log)], cwd=work, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and any(line.split()[0] == phase for line in log.read_text().splitlines() if line):
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the run ended before {phase}: {proc.communicate()[1][-2000:]}"
        time.sleep(delay_s)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 143 and took < 60, (proc.returncode, took, err[-3000:])
        assert len(lines) == 1 and "terminated (SIGTERM)" in lines[0] and "resumable" in lines[0], err[-3000:]
        assert _wait_gone(short_tmp, str(work)) == [], "a process of the stopped run was left"
        run = work / "runs" / "r"
        assert (run / "config.json").is_file() and not list(run.glob("rounds/*.parquet"))
        assert not (run / "results.json").exists()
        if phase != "ray_ready":
            return
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode in (0, 1), done.stderr[-3000:]
        res = json.loads(done.stdout)
        assert len(res["models"]) == 3 and (work / "runs" / "r" / "results.json").exists()
        assert _wait_gone(short_tmp, str(work)) == []
    finally:
        for pid in _left(short_tmp, str(work)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(short_tmp, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="ce48-")  # Ray's socket paths must stay short


@pytest.mark.slow
def test_a_tasks_run_killed_and_resumed_asks_for_no_item_twice(tmp_path):
    """``--tasks task.yaml`` on a checkpoint: SIGKILL once the first rounds are stored, run it again: every item
    the run scored was asked of the model once (the call log), and the stored rounds hold each item once."""
    pytest.importorskip("lm_eval")
    from test_select_checkpoints import _checkpoints

    from lm_eval_support import write_mc_task
    from test_pipeline_support import needs_small_lm, read_log

    needs_small_lm()
    from certeval.inputs.smollm import ensure_converted

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    ckpt = _checkpoints(tmp_path / "train", ensure_converted())[0]
    yaml = write_mc_task(tmp_path / "tasks", n_docs=40)
    short_tmp = tempfile_dir()
    calls = tmp_path / "calls.log"
    argv = [sys.executable, "-m", "certeval", "certify", "--model", f"hf:{ckpt}", "--tasks", yaml, "--goal",
            "halfwidth:0.001", "--method", "uniform", "--batch-size", "4", "--output", str(work / "runs"),
            "--run-id", "t", "--call-log", str(calls), "--json", "--quiet"]
    env = {**_user_env(home, short_tmp), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    try:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        rounds = work / "runs" / "t" / "rounds"
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None and len(list(rounds.glob("*.parquet"))) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()[1][-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stderr.close()
        assert not (work / "runs" / "t" / "results.json").exists()
        assert _wait_gone(short_tmp, str(work)) == [], "the watchdog left a process of the killed run"
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode in (0, 1), done.stderr[-3000:]
        res = json.loads(done.stdout)
        assert res["pipeline"]["resumed"]
        asked = read_log(calls)
        assert len(asked) == len(set(asked)), "an item was asked of the model twice"
        stored = pd.concat([pd.read_parquet(p) for p in sorted(rounds.glob("*.parquet"))])
        assert stored["item_id"].is_unique and len(stored) == res["models"][0]["n_scored"] == len(asked)
        assert _wait_gone(short_tmp, str(work)) == []
    finally:
        for pid in _left(short_tmp, str(work)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(short_tmp, ignore_errors=True)
