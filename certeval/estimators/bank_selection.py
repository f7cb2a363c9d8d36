"""Bank-target best-model selection: top-K within epsilon on the shared item order drawn ∝ weight.

Each model has an exact without-replacement confidence sequence for its bank mean
(:mod:`~.wor_streams`), simultaneous over the M models at level alpha / M; the rule is LUCB's
(Kalyanakrishnan et al. 2012), see :class:`BankSelection`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._validation import InputError, check_alpha, check_in_range, check_positive_int
from .bank_ranking import look_arrays
from .results import to_jsonable
from .wor_streams import absorb_rows, check_weights, make_streams, streams_from_state


@dataclass(frozen=True)
class BestArmResult:
    """Top-K identification within epsilon on the bank target (see :class:`BankSelection`)."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[Any, ...]  # ModelStatus
    n_total: int
    top: int
    epsilon: float
    threshold: float
    alpha: float
    guarantee: str
    done: bool

    @property
    def fraction_used(self) -> float:
        return float(sum(m.n_scored for m in self.models)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "selected": list(self.selected), "discarded": list(self.discarded),
            "models": [dict(vars(m)) for m in self.models], "n_total": self.n_total,
            "fraction_used": self.fraction_used, "top": self.top, "epsilon": self.epsilon,
            "threshold": self.threshold, "halfwidth": self.epsilon, "mode": "best", "alpha": self.alpha,
            "guarantee": self.guarantee, "target": "bank", "done": self.done})


class BankSelection:
    """Best-arm (top-K) identification within epsilon, bank target, on the shared order drawn ∝ weight.

    Each model has a without-replacement CS for its bank mean at level alpha / M (simultaneous over models
    and looks). At each look, with A the models not yet dropped:

    * a model with ``upper < threshold`` is dropped ("below");
    * a model with at least K models of A whose lower bound exceeds its upper bound is surely outside the
      top K and is dropped ("not-best");
    * stop when the K models of A with the largest means, S, satisfy ``min_{i in S} lower_i >=
      max_{j in A \\ S} upper_j - epsilon`` (LUCB's rule, Kalyanakrishnan et al. 2012): on the event that
      every CS covers, each selected model's bank mean is within epsilon of every unselected one's, i.e.
      the selection is an epsilon-top-K of the bank, with probability >= 1 - alpha. Models of S keep being
      scored until then; at exhaustion the exact means decide.
    """

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, top: int = 1, epsilon: float = 0.0,
                 threshold: float = 0.0) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 1:
            raise InputError("selection needs at least one model")
        self.alpha = check_alpha(alpha)
        self.top = check_positive_int(top, "top")
        if self.top > len(self.names):
            raise InputError(f"top must be at most the number of models ({len(self.names)}), got {top!r}")
        self.epsilon = check_in_range(epsilon, "epsilon", 0.0, 1.0)
        self.threshold = check_in_range(threshold, "threshold", 0.0, 1.0)

    def start(self, weights: np.ndarray, bet_horizon: int | None = None) -> "BankSelection":
        """As :meth:`BankRanking.start`: weights in ``update``'s positions, the order drawn ∝ them."""
        self.w = check_weights(weights)
        m = len(self.names)
        self.streams = make_streams(m, self.w.size, self.alpha / m, bet_horizon)
        self.status = np.array(["running"] * m, dtype=object)
        self.look_of = np.zeros(m, dtype=np.int32)
        self.used = np.zeros(m, dtype=np.int32)
        self.mean = np.full(m, np.nan)
        self.lower = np.zeros(m)
        self.upper = np.ones(m)
        self.n = 0
        self.looks = 0
        self.finished = False
        return self

    @property
    def n_total(self) -> int:
        return int(self.w.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in range(len(self.names)) if self.status[k] == "running"]

    def open_look(self, items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A look's checked arrays and the models still running (None when there is nothing to do); counts it."""
        items, x = look_arrays(self.names, items, scores)
        if items.size == 0 or self.finished:
            return None
        live = np.flatnonzero(self.status == "running")
        if np.isnan(x[live]).any():
            raise InputError("every model still in play needs a score for every item of the look")
        self.n += items.size
        self.looks += 1
        return items, x, live

    def update(self, items: Any, scores: Any) -> "BankSelection":
        look = self.open_look(items, scores)
        if look is None:
            return self
        items, x, live = look
        absorb_rows(self.streams, live, x[live], self.w[items])
        self.used[live] = self.n
        mean, lower, upper = self.streams.bounds()
        self.mean[live], self.lower[live], self.upper[live] = mean[live], lower[live], upper[live]
        self._decide(live)
        return self

    def _decide(self, live: np.ndarray) -> None:
        k = self.top
        alive = np.flatnonzero(self.status != "below")
        alive = alive[self.status[alive] != "not-best"]
        for j in live:
            if self.upper[j] < self.threshold:
                self.status[j], self.look_of[j] = "below", self.looks
        alive = alive[self.status[alive] != "below"]
        if len(alive) > k:  # surely outside the top K: K models certainly better
            kth_low = np.sort(self.lower[alive])[::-1][k - 1]
            for j in alive:
                if self.status[j] == "running" and self.upper[j] < kth_low:
                    self.status[j], self.look_of[j] = "not-best", self.looks
            alive = alive[self.status[alive] != "not-best"]
        exact = self.n == self.n_total
        if len(alive) <= k:
            chosen, rest = alive, alive[:0]
        else:
            by_mean = alive[np.argsort(-self.mean[alive], kind="stable")]
            chosen, rest = by_mean[:k], by_mean[k:]
        if exact or len(rest) == 0 or self.lower[chosen].min() >= self.upper[rest].max() - self.epsilon:
            for j in chosen:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "selected", self.looks
            for j in rest:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "not-selected", self.looks
            self.finished = True

    def result(self) -> BestArmResult:
        from .selection import ModelStatus

        m = len(self.names)
        keep = [j for j in range(m) if self.status[j] in ("selected", "running")]
        keep.sort(key=lambda j: -self.mean[j])
        models = tuple(ModelStatus(self.names[j], float(self.mean[j]), float(self.lower[j]), float(self.upper[j]),
                                   int(self.used[j]), str(self.status[j]), int(self.look_of[j]) or None)
                       for j in range(m))
        guarantee = (f"bank target, anytime-valid: without-replacement {self.streams.CONSTRUCTION} CS per model, items "
                     f"drawn in proportion to their weights, at level "
                     f"{1 - self.alpha / m:.4g} (Bonferroni over {m} models); the selection is an epsilon-top-{self.top} "
                     f"of the bank means and every drop is correct, jointly with probability >= {1 - self.alpha:g}")
        return BestArmResult(tuple(self.names[j] for j in keep),
                             tuple(self.names[j] for j in range(m) if j not in keep), models, self.n_total, self.top,
                             self.epsilon, self.threshold, self.alpha, guarantee, self.finished)

    ARRAYS = ("w", "status", "look_of", "used", "mean", "lower", "upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "bank-selection", "names": list(self.names), "alpha": self.alpha, "top": self.top,
                "epsilon": self.epsilon, "threshold": self.threshold, "n": self.n, "looks": self.looks,
                "finished": self.finished, "streams": self.streams.state(),
                **{k: (getattr(self, k).astype(str).tolist() if k == "status" else getattr(self, k).copy())
                   for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "BankSelection":
        obj = cls(state["names"], alpha=float(state["alpha"]), top=int(state["top"]),
                  epsilon=float(state["epsilon"]), threshold=float(state["threshold"]))
        obj.n, obj.looks, obj.finished = int(state["n"]), int(state["looks"]), bool(state["finished"])
        obj.streams = streams_from_state(state["streams"])
        for k in cls.ARRAYS:
            v = np.asarray(state[k])
            setattr(obj, k, v.astype(object) if k == "status" else v.copy())
        return obj
