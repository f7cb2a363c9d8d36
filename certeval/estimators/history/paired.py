"""Bank-target comparison of two models, learning from history: an exact, anytime-valid interval for
the difference of their bank means.

The estimand is ``Δ = Σ_j w_j (x_Aj − x_Bj)``. On the shared items, ``z_j = (x_Aj − x_Bj + 1)/2 ∈ [0, 1]``
has bank mean ``(Δ + 1)/2``, so :class:`~certeval.estimators.single.history.HistoryMethod`'s construction
applies unchanged with the control variate ``(â_Aj − â_Bj + 1)/2``: the predicted paired difference, each
model's prediction refitted on its own scores from its own :class:`~certeval.estimators.history.prior.HistoryPrior`.
The items come from the run's shared order, drawn ∝ the estimand's weights (every model scores the same items),
so each draw of item j has probability ``w_j / (undrawn weight)``. The interval is exact (width 0 once both models have scored the whole
bank) and valid at every look, whatever the history is.

Verdict with margin D ≥ 0 (fixed before data): ``a>b`` once the interval lies above D, ``b>a`` once it
lies below −D, ``equivalent`` once it lies inside (−D, D); at exhaustion the exact difference decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..bank.selection import BankSelection
from ..distribution.comparison import EQUIVALENT, UNDECIDED, VERDICTS, Comparison, pair_verdicts
from ..single.history import TRUST_START, HistoryMethod
from ..validation import check_item_indices, check_same_length, check_scores
from .prior import HistoryPrior

GUARANTEE = ("anytime-valid and exact for the bank's difference: without-replacement betting confidence "
             "sequence (Waudby-Smith & Ramdas 2020) on the paired difference minus its history prediction")
MODEL_GUARANTEE = ("anytime-valid and exact for each model's bank mean: without-replacement betting confidence "
                   "sequence (Waudby-Smith & Ramdas 2020) on the model's score minus its history prediction")


@dataclass(frozen=True)
class PairPrior:
    """The two models' history priors, over the same bank items."""

    a: HistoryPrior
    b: HistoryPrior

    def __post_init__(self) -> None:
        if self.a.n_items != self.b.n_items:
            raise InputError(f"the two history priors describe {self.a.n_items} and {self.b.n_items} items")

    @property
    def n_items(self) -> int:
        return self.a.n_items

    @property
    def n_factors(self) -> int:
        return max(self.a.n_factors, self.b.n_factors)

    def describe(self) -> dict[str, Any]:
        da, db = self.a.describe(), self.b.describe()
        return {"n_models": max(da["n_models"], db["n_models"]),
                "items_matched": min(da["items_matched"], db["items_matched"]),
                "n_factors": self.n_factors, "a": da, "b": db}

    def to_state(self) -> dict[str, Any]:
        return {"pair": True, "a": self.a.to_state(), "b": self.b.to_state()}


class PairDifferenceMethod(HistoryMethod):
    """:class:`HistoryMethod` on ``z = (x_A − x_B + 1)/2`` with the predicted difference as control variate.

    Scores arrive through :meth:`update_pair`; draws through ``propose_shared_order`` (the shared order).
    Not registered: it needs a :class:`PairPrior` and is driven by the paired run.
    """

    name = "history-pair"
    guarantee_text = GUARANTEE

    def _start_extra(self) -> None:
        if not isinstance(self.bank_.history, PairPrior):
            raise InputError("a paired comparison with history needs both models' history priors")
        super()._start_extra()
        self.xa_ = np.full(self.bank_.n_items, np.nan)
        self.xb_ = np.full(self.bank_.n_items, np.nan)

    def _predict(self, seen: np.ndarray) -> np.ndarray:
        pa = self.prior_.a.predict(seen, self.xa_[seen])
        pb = self.prior_.b.predict(seen, self.xb_[seen])
        return (pa - pb + 1.0) / 2.0

    def update_pair(self, items: Any, xa: Any, xb: Any) -> None:
        """Both models' scores on the same items (any order; retries keep the first score)."""
        items = check_item_indices(items, self.bank_.n_items)
        xa, xb = check_scores(xa), check_scores(xb)
        check_same_length(items, xa, "items", "scores of model A")
        check_same_length(items, xb, "items", "scores of model B")
        fresh = ~self.scored_[items]
        self.xa_[items[fresh]] = xa[fresh]
        self.xb_[items[fresh]] = xb[fresh]
        self.update(items, (xa - xb + 1.0) / 2.0)


def bank_comparison(method: PairDifferenceMethod, model_a: str, model_b: str, margin: float,
                    look: int) -> Comparison:
    """The comparison's result at this look (see the module docstring for the verdict rule)."""
    est = method.result()
    n_total = method.bank_.n_items
    if est.n_scored == 0:
        return Comparison(model_a, model_b, 0, n_total, float("nan"), -1.0, 1.0, "undecided", None, None,
                          GUARANTEE, est.confidence, "paired-history", "difference", float(margin))
    diff, lower, upper = 2 * est.mean - 1, 2 * est.lower - 1, 2 * est.upper - 1
    code = int(pair_verdicts(np.array([diff]), np.array([lower]), np.array([upper]), margin, est.exhausted)[0])
    verdict = VERDICTS[code]
    rule = "exhausted" if est.exhausted else (None if code == UNDECIDED else
                                              "equivalence" if code == EQUIVALENT else "efficacy")
    return Comparison(model_a, model_b, int(est.n_scored), n_total, float(diff), float(lower), float(upper),
                      verdict, rule, look if rule else None, GUARANTEE, est.confidence, "paired-history",
                      "difference", float(margin), exact=bool(est.exhausted))


class HistorySelection:
    """Best-arm (top-K) selection on the bank target that learns from history.

    The rule is :class:`~certeval.estimators.bank.selection.BankSelection`'s (drops below the threshold, drops of models with K
    models surely better, LUCB's epsilon stop; for the best model within epsilon its "not the best" and ε-listing
    tests on the paired differences, else its pair CSs). Each model's bank mean gets :class:`HistoryMethod`'s exact
    without-replacement betting CS with its own history prediction as control variate, at level
    ``1 - alpha / (2M)`` (``1 - alpha / M`` where the rule has neither pair CSs nor tests), on the run's shared
    order (drawn ∝ weight). The pairs stay plain: a control variate for a pair (its predicted difference, as
    ``rank --history``) was measured on helm_mmlu (top-1 within 0.02, 22 models, the other 22 as history, 100
    orders) at 0.377 of the cells against 0.351 with the pair CSs plain — the bet values ``(z − a + 1)/2`` halve
    the range the bets may use, and close models' predicted differences explain too little (variance ratio about
    0.87) to pay that back.
    The rule's statement holds jointly with probability >= 1 - alpha, whatever the history.
    """

    trust_start = TRUST_START  # each model's history trust before its first look (HistoryMethod's)

    def __init__(self, names: Sequence[str], priors: Sequence[Any], spec: Any, *, alpha: float = 0.05,
                 top: int = 1, epsilon: float = 0.0, threshold: float = 0.0) -> None:
        self._adopt(BankSelection(names, alpha=alpha, top=top, epsilon=epsilon, threshold=threshold), priors, spec)

    def _adopt(self, rule: BankSelection, priors: Sequence[Any], spec: Any) -> None:
        self.rule = rule
        self.names = rule.names
        self.priors = tuple(priors)
        self.spec = spec
        if len(self.priors) != len(self.names):
            raise InputError(f"one history prior per model: {len(self.names)} models, {len(self.priors)} priors")

    def start(self) -> HistorySelection:
        rule = self.rule.start(self.spec.weights())
        # beside the rule's pair CSs or tests alpha is split: half for the models, half for the pairs
        confidence = 1.0 - rule.model_alpha()
        self.methods_ = [HistoryMethod(confidence=confidence, subset_intervals=False, trust_start=self.trust_start).start(
            replace(self.spec, history=prior)) for prior in self.priors]
        return self

    @property
    def n_total(self) -> int:
        return self.rule.n_total

    @property
    def active(self) -> list[str]:
        return self.rule.active

    def update(self, items: Any, scores: Any) -> HistorySelection:
        rule = self.rule
        look = rule.open_look(items, scores)
        if look is None:
            return self
        items, x, live = look
        for j in live:
            method = self.methods_[j]
            fresh = ~method.in_log_[items]
            if fresh.any():  # the shared order's draws (probability w_j / undrawn weight), predictions fixed first
                method.propose_shared_order(items[fresh])
            method.update(items, x[j])
            est = method.result()
            rule.used[j] = est.n_scored
            rule.mean[j], rule.lower[j], rule.upper[j] = est.mean, est.lower, est.upper
        rule.absorb_paired(live, x, items)
        rule._decide(live)
        return self

    def result(self):
        rule = self.rule
        res = rule.result()
        level = f"one per model at level {1 - rule.model_alpha():.4g}{rule.pairs_guarantee()}"
        guarantee = f"{MODEL_GUARANTEE}, {level}; {rule.selection_statement()}, whatever the history"
        return replace(res, guarantee=guarantee)

    def describe_history(self) -> dict[str, Any]:
        return self.priors[0].describe() if self.priors else {}


class HistoryPrecision(HistorySelection):
    """Leaderboard precision that learns from history (``rank --goal halfwidth:E --history SOURCE``).

    :class:`~certeval.estimators.bank.precision.BankPrecision`'s rule — a model leaves once its half-width is at most E; "a>b" when a's
    interval lies above b's; overlapping intervals share a tie group — on :class:`HistorySelection`'s per-model
    intervals: each model's bank mean in :class:`HistoryMethod`'s exact without-replacement betting CS with its own
    history prediction as control variate, at level ``1 − alpha/M``, on the run's shared order. Every interval and
    every order statement hold jointly with probability >= 1 − alpha (Bonferroni over the M models), whatever the
    history; useless history costs items, never validity. ``result()`` is a :class:`~certeval.estimators.distribution.ranking.Ranking`.

    Each model's trust starts at 1 (the history followed fully until its first look is scored; then measured as in
    ``certify --history``): on helm_mmlu at ±0.05 (6 orders) the board used 0.959 of the plain board's cells
    starting at 1, 0.980 at ½ and 1.007 at 0 — at level α/M the first look's control variate weighs on every
    later bet.
    """

    trust_start = 1.0

    def __init__(self, names: Sequence[str], priors: Sequence[Any], spec: Any, *, halfwidth: float,
                 alpha: float = 0.05) -> None:
        from ..bank.precision import BankPrecision

        self._adopt(BankPrecision(names, halfwidth=halfwidth, alpha=alpha), priors, spec)

    def model_intervals(self) -> dict[str, tuple[float, float, float, int]]:
        return self.rule.model_intervals()

    def result(self):
        rule = self.rule
        m = len(self.names)
        guarantee = (f"{MODEL_GUARANTEE}, one per model at level {1 - rule.model_alpha():.4g}; every model's interval "
                     f"and every order statement (a>b: a's interval above b's) hold jointly with probability >= "
                     f"{1 - rule.alpha:g} (Bonferroni over the {m} models), whatever the history")
        return replace(rule.result(), guarantee=guarantee)
