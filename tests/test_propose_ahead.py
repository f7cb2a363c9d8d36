"""Proposing ahead (issue 42): while the controller absorbs a round's scores and decides, the next round's items
are already queued on the model actors. The decision at each look must not change: the same fixed-seed run with
and without it records the same looks, items and results (real Prefect flows and Ray actors, replay models); the
items scored beyond use are kept and reported (results.json ``pipeline.ahead``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from certeval.requests import request_for
from certeval.runs.plan import make_plan
from certeval.runtime.options import RuntimeOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_fixed_seed import digest  # noqa: E402
from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores  # noqa: E402

CASES = {
    "certify-adaptive": dict(kind="certify", models=(MIDDLE,), goal="halfwidth:0.1", method="adaptive"),
    "certify-two-uniform": dict(kind="certify", models=(STRONG, WEAK), goal="halfwidth:0.12", method="uniform"),
    "compare": dict(kind="compare", models=(STRONG, MIDDLE), margin=0.02),
    # replay models that take time per item: batches are still queued or running when models leave and at the end
    "rank": dict(kind="rank", models=(STRONG, MIDDLE, WEAK), margin=0.02, latency=0.01),
    "select": dict(kind="select", models=(STRONG, MIDDLE, WEAK), halfwidth=0.1, latency=0.01),
}


def _run(root: Path, name: str, ahead: str, log: Path) -> tuple[dict, dict]:
    from certeval.flows.pipeline import run_plan

    case = dict(CASES[name])
    kind, models, latency = case.pop("kind"), case.pop("models"), case.pop("latency", None)
    scores = small_scores(root, models=(STRONG, MIDDLE, WEAK), n_items=150)
    options = {} if latency is None else {"latency": latency}
    plan, _ = make_plan(request_for(kind, models=[replay(m, scores, **options) for m in models], output=str(root / "runs"),
                                    run_id=name, seed=5, batch_size=20,
                                    options=RuntimeOptions(propose_ahead=ahead, call_log=str(log)), **case))
    result = run_plan(plan)
    return result, digest(root / "runs" / name)


def _cached_pairs(runs: Path) -> int:
    """The distinct (model, item) pairs in the score caches under a run root."""
    from certeval.storage import ScoreCache, filesystem

    folders = [p for p in (runs / "_cache").iterdir() if p.is_dir() and not p.name.startswith("_")]  # _shared: parts
    assert folders, runs
    return sum(len(ScoreCache(*filesystem(str(folder))).load()) for folder in folders)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_looks_with_and_without_proposing_ahead(infra, tmp_path, name):
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off, off_digest = _run(tmp_path / "off", name, "off", tmp_path / "off.calls")
    on, on_digest = _run(tmp_path / "on", name, "on", tmp_path / "on.calls")
    assert on_digest == off_digest  # every look's statistics and items, and results.json's numbers
    assert off["pipeline"]["ahead"] is None
    assert on["pipeline"]["items_sent"] == off["pipeline"]["items_sent"]  # what the rounds used, sent once
    ahead = on["pipeline"]["ahead"]
    assert ahead["sent"] > 0 and ahead["used"] > 0, ahead
    # every item sent ahead is used by a round, scored and kept unused, withdrawn before it ran, or lost
    assert ahead["used"] + ahead["scored_unused"] + ahead["cancelled"] + ahead["lost"] == ahead["sent"], ahead
    assert ahead["lost"] == 0, ahead
    for model in on["models"]:
        label = model["model"]
        items = ahead["items"][label]
        assert items["used"] == model["n_scored"] and items["scored"] >= items["used"]
        assert items["scored"] - items["used"] == ahead["scored_unused_per_model"].get(label, 0)
    # every scoring an actor performed is accounted for (issue 58): what the rounds used plus what was scored ahead
    # and never used, item for item the (model, item) pairs the run's score caches hold; nothing "cancelled" ran
    calls = (tmp_path / "on.calls").read_text().splitlines()
    used = sum(on["pipeline"]["items_sent"].values())
    assert len(calls) == len(set(calls)) == used + ahead["scored_unused"], (len(calls), used, ahead)
    assert _cached_pairs(tmp_path / "on" / "runs") == len(calls)
    assert len((tmp_path / "off.calls").read_text().splitlines()) == used
    assert _cached_pairs(tmp_path / "off" / "runs") == used
    stored = json.loads((tmp_path / "on" / "runs" / name / "results.json").read_text())
    assert stored["pipeline"]["ahead"]["sent"] == ahead["sent"]
    # where the time went (issue 58): each phase measured, none negative; the report's is the CLI's (none here)
    phases = stored["pipeline"]["phases"]
    assert phases["startup_s"] >= 0 and phases["model_load_s"] >= 0, phases
    assert phases["rounds_s"] > 0 and phases["controller_s"] > 0 and phases["storage_s"] > 0, phases
    assert phases["report_s"] is None
    assert phases["rounds_s"] + phases["controller_s"] + phases["storage_s"] <= stored["pipeline"]["wall_s"] + 0.5


def test_the_option_and_when_auto_proposes_ahead():
    from types import SimpleNamespace

    from certeval.errors import InputError
    from certeval.runs.run import Run

    with pytest.raises(InputError, match="--propose-ahead"):
        RuntimeOptions(propose_ahead="maybe")

    class Pool:
        supports_ahead = True

    def asks(mode: str, models: tuple[str, ...], pool: object = Pool()) -> bool:
        run = SimpleNamespace(plan=SimpleNamespace(options=RuntimeOptions(propose_ahead=mode), models=models))
        return Run.proposes_ahead(run, pool)

    replayed, hosted = ("replay:bundled:helm_mmlu#a",), ("replay:bundled:helm_mmlu#a", "hf:bundled:smollm2")
    assert not asks("auto", replayed) and asks("auto", hosted)  # auto: a model whose calls cost time
    assert asks("on", replayed) and not asks("off", hosted)
    assert not asks("on", hosted, pool=object())  # a pool that cannot (rescore's recorded outputs, InlinePool)
