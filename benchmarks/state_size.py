"""State size: bytes of ``state/<model>.json`` written per model per round, before and after slim states.

One ``certify`` run per single-model method on ``bundled:helm_mmlu`` (567 items, 57 subjects) with a
384-d ``embedding`` column in the bank, replaying ``openai_davinci``'s recorded scores. The embeddings
are random (standard normal, seeded): only their size matters here, not what they say about the items.
The goal is never met (``halfwidth:0.0001``), so every run goes on until the bank is exhausted.

The run goes through the pipeline's own round loop (``certeval.runs.run.Run``: select, infer, update,
decide, store_round) with the model answered in-process by the replay backend's worker (no Ray, no
Prefect: they do not touch what is stored). Every ``write_state`` call is intercepted, so the same
state of the same round is measured twice:

* ``before``: what the writer wrote before slim states — the whole state as indented JSON, the
  embeddings, subset codes and history prior inline, rejected grids as hex bitmasks;
* ``after``: the bytes of the file actually written (compact JSON, per-item constant arrays by
  reference to ``features/<sha256>.npy``, rejected grids as run lengths).

The one-time ``features/`` files are reported apart (bytes, count). The check: the largest ``after``
over all rounds of every method is at most 50 kB.

    python -m benchmarks state_size            # batch 50 (12 rounds), every method
    python -m benchmarks state_size --quick    # batch 150 (4 rounds), every method
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402

METHODS = ("uniform", "static", "seq", "cer-eval", "adaptive", "history")
SCORES = "bundled:helm_mmlu"
MODEL = "openai_davinci"
DIM = 384
LIMIT_BYTES = 50_000


class InlinePool:
    """The model pool's interface, answered in this process by the backends' own worker (which also
    writes the score cache, as the Ray actors do)."""

    def __init__(self, specs: dict[str, str], cache_urls: dict[str, str]) -> None:
        from certeval.hosting.pool import PoolStats
        from certeval.hosting.worker import ModelWorker

        self.worker = ModelWorker(specs, cache_urls, None)
        self.stats = PoolStats()

    def score(self, requests, batch_size, on_result=None):
        out = {}
        for label, reqs in requests.items():
            for i in range(0, len(reqs), max(1, batch_size)):
                chunk = reqs[i:i + batch_size]
                got = self.worker.score([(label, [item for _, item in chunk], [key for key, _ in chunk])])[0]
                self.stats.batches += 1
                out.setdefault(label, []).extend(got)
        return out


def drive(plan) -> object:
    """The flow's round loop without Prefect and Ray: the same Run methods, in the same order."""
    from certeval.engine import play
    from certeval.runs.round_steps import RunSteps
    from certeval.runs.run import Run

    run = Run.open(plan)
    try:
        run.embed()
        run.restore()
        pool = InlinePool(dict(zip(plan.labels, plan.models)), {label: c.folder.url() for label, c in run.caches.items()})
        play(RunSteps(run, pool))
        run.compact_cache()
        run.results()
        return run
    finally:
        if run.owns_lock:
            run.store.release_lock()


def bank_with_embeddings(folder: Path, seed: int) -> str:
    """helm_mmlu's items and subjects with a random 384-d embedding per item (a Parquet bank file)."""
    from certeval.inputs.banks import load_scores

    frame = load_scores(SCORES)
    items = frame[frame["model"] == MODEL][["item_id", "subset"]].drop_duplicates("item_id").reset_index(drop=True)
    rng = np.random.default_rng(seed)
    items["embedding"] = list(rng.standard_normal((len(items), DIM)))
    path = folder / "helm_mmlu_embedded.parquet"
    items.to_parquet(path, index=False)
    return str(path)


def old_encoding(state: dict) -> int:
    """Bytes of ``state`` as the writer stored it before slim states: indented JSON, arrays inline,
    rejected grids as hex bitmasks."""
    from certeval.estimators.single.betting_strata import _unpack
    from certeval.storage import dumps

    method = state.get("method_state") or {}
    extra = method.get("extra")
    if isinstance(extra, dict) and "rejected" in extra:
        grid = int(method.get("params", {}).get("grid_size", 4097))

        def hexed(text):
            return np.packbits(_unpack(text, grid).astype(np.uint8)).tobytes().hex()

        rejected = extra["rejected"]
        rejected = ({k: hexed(v) for k, v in rejected.items()} if isinstance(rejected, dict)
                    else [hexed(v) for v in rejected])
        state = {**state, "method_state": {**method, "extra": {**extra, "rejected": rejected}}}
    return len(dumps(state))


def measure(method: str, bank: str, root: Path, batch: int, seed: int) -> dict:
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan
    from certeval.storage import safe_name

    history = [SCORES] if method == "history" else None
    plan, _ = make_plan(Certify(models=[f"replay:{SCORES}#{MODEL}"], bank=bank, goal="halfwidth:0.0001",
                                    method=method, batch_size=batch, seed=seed, output=str(root), run_id=method,
                                    history=history))
    label = plan.labels[0]
    rounds: list[dict] = []
    from certeval.storage import RunStore

    real = RunStore.write_state

    def spy(store, lbl, state):
        t = time.perf_counter()
        real(store, lbl, state)
        write_s = time.perf_counter() - t
        after = (Path(store.folder.path) / "state" / f"{safe_name(lbl)}.json").stat().st_size
        rounds.append({"round": int(state["round"]), "before_bytes": old_encoding(state), "after_bytes": after,
                       "write_s": round(write_s, 4)})

    RunStore.write_state = spy
    t0 = time.perf_counter()
    try:
        run = drive(plan)
    finally:
        RunStore.write_state = real
    wall = time.perf_counter() - t0
    refs = sorted((root / method / "features").glob("*.npy"))
    # the stored state resumes: the method it rebuilds gives the same result as the one that ran
    again = RunStore(str(root), method).read_state(label)
    from certeval.estimators import method_from_state

    resumed = method_from_state(again["method_state"]).result()
    ran = run.methods[label].result()
    return {
        "method": method, "label": label, "rounds": len(rounds), "n_scored": int(run.n_scored(label)),
        "before_bytes_max": max(r["before_bytes"] for r in rounds),
        "after_bytes_max": max(r["after_bytes"] for r in rounds),
        "before_bytes_mean": float(np.mean([r["before_bytes"] for r in rounds])),
        "after_bytes_mean": float(np.mean([r["after_bytes"] for r in rounds])),
        "features_files": len(refs), "features_bytes": int(sum(p.stat().st_size for p in refs)),
        "resumed_state_same_result": (resumed.lower, resumed.upper, resumed.n_scored) == (ran.lower, ran.upper,
                                                                                          ran.n_scored),
        "wall_s": round(wall, 2), "per_round": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks state_size", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 150 (4 rounds per method)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--batch", type=int, default=None, help="items per round (default 50; --quick 150)")
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    batch = args.batch or (150 if args.quick else 50)
    methods = [m for m in args.methods.split(",") if m]
    cells = []
    with tempfile.TemporaryDirectory(prefix="certeval-state-size-") as tmp:
        root = Path(tmp)
        bank = bank_with_embeddings(root, args.seed)
        for method in methods:
            cell = measure(method, bank, root / "runs", batch, args.seed)
            cells.append(cell)
            print(f"{method:>9}: {cell['rounds']:2d} rounds, state per round before {cell['before_bytes_max']:>9,d} B "
                  f"max, after {cell['after_bytes_max']:>7,d} B max; features/ {cell['features_files']} file(s) "
                  f"{cell['features_bytes']:,d} B once; {cell['wall_s']} s", flush=True)
    worst = max(c["after_bytes_max"] for c in cells)
    payload = {
        "seed": args.seed, "dataset": SCORES, "model": MODEL, "n_items": 567, "embedding_dim": DIM,
        "embeddings": "random standard normal (seeded): only their size matters for this benchmark",
        "batch_size": batch, "goal": "halfwidth:0.0001 (never met: every run exhausts the bank)",
        "limit_bytes": LIMIT_BYTES, "after_bytes_max": worst, "within_limit": worst <= LIMIT_BYTES,
        "cells": cells,
    }
    path = write_result("state_size", payload, args.quick, seed=args.seed)
    print(f"largest state after: {worst:,d} B (limit {LIMIT_BYTES:,d}); wrote {path}")
    return 0 if worst <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
