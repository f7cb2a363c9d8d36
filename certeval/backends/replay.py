"""Replay host: answers from recorded scores (``replay:<scores file>#<model>``).

Optional ``?latency=SECONDS`` sleeps per item to simulate a real model in load tests.
"""

from __future__ import annotations

import time
from typing import Any

from ..banks import load_scores
from ..estimators._validation import InputError
from .base import ModelHost, ModelSpec


class ReplayHost(ModelHost):
    def __init__(self, spec: ModelSpec, latency_s: float = 0.0) -> None:
        self.spec = spec
        self.latency_s = latency_s
        frame = load_scores(spec.location)
        sub = frame[frame["model"] == spec.name]
        if sub.empty:
            models = sorted(frame["model"].unique())
            raise InputError(f"unknown model {spec.name!r} in {spec.location!r}; it has {len(models)} models, e.g. {', '.join(models[:5])}")
        self._scores = dict(zip(sub["item_id"].astype(str), sub["score"].astype(float)))
        self.calls = 0

    @property
    def item_ids(self) -> list[str]:
        return list(self._scores)

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        out = []
        for item in items:
            t0 = time.perf_counter()
            iid = str(item["item_id"])
            if iid not in self._scores:
                raise InputError(f"model {self.spec.name!r} has no recorded score for item {iid!r}")
            if self.latency_s:
                time.sleep(self.latency_s)
            out.append({"item_id": iid, "score": self._scores[iid], "tokens": 0,
                        "latency_s": time.perf_counter() - t0})
        return out


def build_host(spec: ModelSpec, **kwargs: Any) -> ReplayHost:
    latency = float(spec.option("latency", kwargs.get("latency_s", 0.0)))
    return ReplayHost(spec, latency_s=latency)
