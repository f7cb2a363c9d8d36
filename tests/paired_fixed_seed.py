"""Fixed-seed paired runs (compare, rank, select; both targets; with and without history), driven through the
run's round loop in this process (``benchmarks.state_size.drive``: the same Run steps as the flow, scores from
the replay backend's own worker), reduced to what a user reads: every look's recorded statistics, the items each
round scored, and results.json's numbers. ``python tests/paired_fixed_seed.py`` rewrites the stored digest
(``tests/data/paired_fixed_seed.json``) — only when a change of results is intended and said in its commit."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay, small_scores  # noqa: E402

STORED = HERE / "data" / "paired_fixed_seed.json"
CASES = {
    "compare-bank": dict(kind="compare", target="bank"),
    "compare-bank-history": dict(kind="compare", target="bank", history=True),
    "compare-distribution": dict(kind="compare", target="distribution"),
    "rank-bank": dict(kind="rank", target="bank"),
    "rank-bank-history": dict(kind="rank", target="bank", history=True),
    "rank-distribution": dict(kind="rank", target="distribution"),
    "rank-bank-budget": dict(kind="rank", target="bank", max_items=60),
    "rank-bank-epsilon": dict(kind="rank", target="bank", epsilon=0.1, margin=0.0),
    "select-bank": dict(kind="select", target="bank", threshold=0.3, halfwidth=0.05),
    "select-bank-history": dict(kind="select", target="bank", history=True, threshold=0.3, halfwidth=0.05),
    "select-distribution": dict(kind="select", target="distribution", threshold=0.3, halfwidth=0.05),
}
RESULT_KEYS = ("kind", "target", "seed", "rounds", "done", "reached", "confidence")
MODEL_KEYS = ("model", "mean", "lower", "upper", "n_scored", "decision", "selection_status")


def run_case(name: str, folder: Path) -> dict:
    """The digest of one case, run under ``folder``."""
    from benchmarks.state_size import drive
    from certeval.requests import request_for
    from certeval.runs.plan import make_plan

    case = dict(CASES[name])
    kind, history = case.pop("kind"), case.pop("history", False)
    scores = small_scores(folder, n_items=150)
    names = (STRONG, MIDDLE) if kind == "compare" else (STRONG, MIDDLE, WEAK)
    if kind != "select":  # compare and rank state their verdicts at a margin; select has none
        case.setdefault("margin", 0.02)
    plan, _ = make_plan(request_for(kind, models=[replay(m, scores) for m in names], output=str(folder / "runs"),
                                    run_id=name, seed=2, batch_size=20, history=[SCORES] if history else None,
                                    **case))
    drive(plan)
    return digest(folder / "runs" / name)


def digest(run_folder: Path) -> dict:
    results = json.loads((run_folder / "results.json").read_text())
    rounds = pd.concat(pd.read_parquet(f) for f in sorted((run_folder / "rounds").glob("*.parquet")))
    looks = []
    for (round_, model), rows in rounds.groupby(["round", "model"], sort=True):
        rec = {c: rows.iloc[0][c] for c in sorted(rounds.columns) if c.startswith("look_")}
        items = hashlib.sha256("\n".join(map(str, rows["item_id"])).encode()).hexdigest()[:16]
        looks.append({"round": int(round_), "model": model, "n_items": len(rows), "items_sha256": items,
                      **{k: _plain(v) for k, v in rec.items()}})
    out = {k: results.get(k) for k in RESULT_KEYS}
    out["models"] = [{k: m[k] for k in MODEL_KEYS if k in m} for m in results["models"]]
    for group in ("pairs", "ranking", "selection"):
        if results.get(group) is not None:
            out[group] = results[group]
    out["looks"] = looks
    return json.loads(json.dumps(out, default=_plain))


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def differences(stored, fresh, tol: float, path: str = "") -> list[str]:
    """Where two digests differ: floats beyond ``tol`` (absolute), anything else at all."""
    if isinstance(stored, dict) and isinstance(fresh, dict):
        out = [f"{path}.{k}: only in one" for k in set(stored) ^ set(fresh)]
        for k in sorted(set(stored) & set(fresh)):
            out += differences(stored[k], fresh[k], tol, f"{path}.{k}")
        return out
    if isinstance(stored, list) and isinstance(fresh, list):
        if len(stored) != len(fresh):
            return [f"{path}: {len(stored)} entries vs {len(fresh)}"]
        return [d for i, (a, b) in enumerate(zip(stored, fresh)) for d in differences(a, b, tol, f"{path}[{i}]")]
    if isinstance(stored, float) or isinstance(fresh, float):
        if isinstance(stored, (int, float)) and isinstance(fresh, (int, float)) and abs(stored - fresh) <= tol:
            return []
    if stored != fresh:
        return [f"{path}: {stored!r} vs {fresh!r}"]
    return []


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        digests = {}
        for name in CASES:
            folder = Path(tmp) / name
            folder.mkdir()
            digests[name] = run_case(name, folder)
            print(name, digests[name]["rounds"], "rounds", file=sys.stderr)
    STORED.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
