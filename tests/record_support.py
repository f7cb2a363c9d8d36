"""Complete results.json records for report tests that build a run folder by hand (not through the pipeline): the
numbers a test cares about, every other field of :class:`certeval.record.results.RunResults` filled with a neutral
value, so the record reads through its type like a stored run's."""

from __future__ import annotations

from typing import Any

from certeval.record.results import SCHEMA_VERSION, Settings

SETTINGS = tuple(Settings.__dataclass_fields__)


def decision(**over: Any) -> dict[str, Any]:
    return {"done": True, "rule": None, "look": None, "reached": True, "verdict": None, "detail": "", **over}


def model_entry(model: str, mean: float, lower: float, upper: float, n_scored: int, n_total: int,
                **over: Any) -> dict[str, Any]:
    """One model's entry (its live estimate the same numbers)."""
    same = {"mean": mean, "lower": lower, "upper": upper, "n_scored": n_scored, "confidence": 0.95,
            "anytime_valid": True, "guarantee": "anytime", "validity": "exact", "method": "uniform",
            "halfwidth": (upper - lower) / 2}
    estimate = {**same, "target": "bank", "n_total": n_total, "exhausted": False, "subsets": [], "extra": {}}
    return {"model": model, "spec": f"replay:scores.parquet#{model}", **same, "n_total": n_total,
            "items_sent_to_model": n_scored, "decision": decision(), "estimate": estimate, "results": {}, **over}


def pair(model_a: str, model_b: str, diff: float, lower: float, upper: float, verdict: str, **over: Any
         ) -> dict[str, Any]:
    return {"model_a": model_a, "model_b": model_b, "n_items": 100, "n_total": 300, "diff": diff, "lower": lower,
            "upper": upper, "verdict": verdict, "rule": "efficacy", "look": 1, "guarantee": "group-sequential",
            "confidence": 0.95, "statistic": "paired", "goal": "difference", "margin": 0.0, "exact": False, **over}


def ranking(tie_groups: list[list[str]], means: list[float], **over: Any) -> dict[str, Any]:
    models = [m for group in tie_groups for m in group]
    return {"models": models, "tie_groups": tie_groups, "means": means, "items_used": [100] * len(models),
            "n_total": 300, "fraction_used": 1 / 3, "alpha": 0.05, "correction": "bonferroni", "guarantee": "",
            "statement": "strict", "epsilon": None, "halfwidth": None, "n_pairs": len(models) * (len(models) - 1) // 2,
            "n_pairs_decided": 0, **over}


def run_record(kind: str, models: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    """A complete results.json of a ``kind`` run of ``models`` (entries from :func:`model_entry`)."""
    return {"schema_version": SCHEMA_VERSION, "run_id": "r", "kind": kind, "task": "t", "bank": None,
            "target": "bank", "confidence": 0.95, "seed": 0, "rounds": 1, "done": True, "reached": True,
            "aggregate": {"name": "mean", "subsets": 1, "text": "the mean over the bank's items"}, "models": models,
            "results": {}, "lm_eval": {}, "history": None, "config": dict.fromkeys(SETTINGS),
            "run_folder": "runs/r", "pipeline": {"resumed": False, "items_sent": {}, "ray_address": "local",
                                                 "wall_s": 0.0}, **over}
