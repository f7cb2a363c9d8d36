"""Bank-target comparison of two models, learning from history: an exact, anytime-valid interval for
the difference of their bank means.

The estimand is ``Δ = Σ_j w_j (x_Aj − x_Bj)``. On the shared items, ``z_j = (x_Aj − x_Bj + 1)/2 ∈ [0, 1]``
has bank mean ``(Δ + 1)/2``, so :class:`~certeval.estimators.single.history.HistoryMethod`'s construction
applies unchanged with the control variate ``(â_Aj − â_Bj + 1)/2``: the predicted paired difference, each
model's prediction refitted on its own scores from its own :class:`~certeval.estimators.history.HistoryPrior`.
The items come from the run's shared uniform order (every model scores the same items), so each draw has
probability 1 / (undrawn items). The interval is exact (width 0 once both models have scored the whole
bank) and valid at every look, whatever the history is.

Verdict with margin D ≥ 0 (fixed before data): ``a>b`` once the interval lies above D, ``b>a`` once it
lies below −D, ``equivalent`` once it lies inside (−D, D); at exhaustion the exact difference decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import InputError, check_item_indices, check_scores, check_same_length
from .comparison import Comparison
from .history import HistoryPrior
from .single.history import HistoryMethod

GUARANTEE = ("anytime-valid and exact for the bank's difference: without-replacement betting confidence "
             "sequence (Waudby-Smith & Ramdas 2020) on the paired difference minus its history prediction")


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

    Scores arrive through :meth:`update_pair`; draws through ``propose_uniform_order`` (the shared order).
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
    verdict, rule = "undecided", None
    if est.exhausted:  # the exact difference decides
        verdict = "a>b" if diff > margin else ("b>a" if diff < -margin else "equivalent")
        rule = "exhausted"
    elif lower > margin:
        verdict, rule = "a>b", "efficacy"
    elif upper < -margin:
        verdict, rule = "b>a", "efficacy"
    elif margin > 0 and lower > -margin and upper < margin:
        verdict, rule = "equivalent", "equivalence"
    return Comparison(model_a, model_b, int(est.n_scored), n_total, float(diff), float(lower), float(upper),
                      verdict, rule, look if rule else None, GUARANTEE, est.confidence, "paired-history",
                      "difference", float(margin), exact=bool(est.exhausted))
