"""``uniform``: draws in proportion to the estimand's weights, without replacement, and the exact interval.

The honest baseline. For a plain bank mean, items are drawn uniformly at random without replacement and the
interval is the hedged without-replacement betting confidence sequence of Waudby-Smith & Ramdas (NeurIPS 2020,
§3). For a mean of sub-dataset means (Arviv et al. 2026, eq. 1) the draws are in proportion to each item's weight in the
estimand (each sub-dataset in proportion to its weight, uniformly inside it), and the interval is ONE betting
confidence sequence for the estimand itself on the stratified control-variate statistic of ``adaptive``
(:class:`~certeval.estimators.single.adaptive.AdaptiveMethod`, ``combine='joint'``): no union bound over
sub-datasets. Comparing ``uniform`` with ``adaptive`` isolates the value of variance-adaptive (Neyman)
allocation; ``combine='union'`` gives the earlier construction (one CS per sub-dataset at δ/H, uniform draws
over items), 2–3× more items on banks with sub-datasets.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..protocol import register
from .adaptive import AdaptiveMethod, Stratification


@register
class UniformMethod(AdaptiveMethod):
    """Draws ∝ the estimand's weights (uniform for a plain mean) + the exact betting CS (see module docstring)."""

    name = "uniform"
    option_groups: ClassVar[dict[str, type]] = {}  # its strata are the sub-datasets: no stratification to set

    def __init__(self, confidence: float = 0.95, target: str = "bank", grid_size: int = 4097,
                 combine: str = "auto", bet_halfwidth: float | None = None, bet_horizon: int | None = None) -> None:
        super().__init__(confidence=confidence, target=target, grid_size=grid_size,
                         stratification=Stratification("subsets"), combine=combine, bet_halfwidth=bet_halfwidth,
                         bet_horizon=bet_horizon)

    @property
    def guarantee_text(self) -> str:  # type: ignore[override]
        if getattr(self, "combine_", "union") == "joint":
            return ("anytime-valid and exact: one without-replacement betting confidence sequence (Waudby-Smith & "
                    "Ramdas 2020) for the estimand, draws in proportion to its weights; per-subset intervals each "
                    "valid on their own")
        return ("anytime-valid and exact: without-replacement betting confidence sequence (Waudby-Smith & Ramdas "
                "2020)" + (", union bound over sub-datasets" if self._live_strata.size > 1 else ""))

    def _draw_probabilities(self, left: np.ndarray, var: np.ndarray, a: np.ndarray, i: int) -> np.ndarray:
        """Each stratum in proportion to its undrawn weight: items ∝ their weight in the estimand."""
        u = left * self.item_weight_in_stratum_
        total = u.sum()
        return np.where(left > 0, u / total, 0.0) if total > 0 else np.zeros_like(u)

    def _choose_union(self, k: int, rng: np.random.Generator):
        return rng.choice(self.available(), size=k, replace=False), None
