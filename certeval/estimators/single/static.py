"""``static``: the Base of Cer-Eval (Wang et al. 2025, arXiv:2505.03814, §6.1) — score every item, then one fixed-sample interval.

* ``target='bank'``: once every item is scored the bank mean is known exactly
  (zero width); before that only the deterministic bounds hold.
* ``target='distribution'``: Hoeffding's inequality for the weighted mean at the
  final n, radius sqrt(ln(2/δ) Σ_h W_h²/n_h / 2) (Hoeffding 1963, Thm 2; with
  one stratum this is sqrt(ln(2/δ)/(2n)); Wang et al. 2025 quotes the one-sided
  ε* = sqrt(ln(1/δ)/(2n))). Before every item is scored the interval is the
  trivial [0, 1]: a fixed-sample interval is **not** anytime valid, so it is
  only given at the pre-set sample size (the whole bank).
"""

from __future__ import annotations

import math

import numpy as np

from ..protocol import register
from .bounds import hoeffding_radius
from .strata import StratifiedMethod


@register
class StaticMethod(StratifiedMethod):
    """Cer-Eval's Base (Wang et al. 2025): evaluate all items, one fixed-sample Hoeffding interval (not anytime valid)."""

    name = "static"
    anytime_valid = False
    guarantee_text = "fixed-sample interval at the full bank only (not anytime valid)"

    def __init__(self, confidence: float = 0.95, target: str = "bank") -> None:
        super().__init__(confidence=confidence, target=target)

    def _stratum_interval(self, h: int) -> tuple[float, float]:
        n = int(self.stratum_n_[h])
        if self.target == "bank" or n < self.stratum_size_[h]:
            return self._clip_to_feasible(h, 0.0, 1.0)
        mean = self._stratum_mean(h)
        r = hoeffding_radius(n, self._stratum_delta)
        return max(0.0, mean - r), min(1.0, mean + r)

    def _overall_interval(self, means, lows, highs):
        point = float(self.stratum_weight_ @ np.nan_to_num(means, nan=0.5))
        if self.target == "bank" or not self.exhausted:
            return point, float(self.stratum_weight_ @ lows), float(self.stratum_weight_ @ highs)
        live = self._live_strata
        var_factor = float(np.sum(self.stratum_weight_[live] ** 2 / self.stratum_n_[live]))
        r = math.sqrt(math.log(2.0 / self.delta) * var_factor / 2.0)
        return point, max(0.0, point - r), min(1.0, point + r)
