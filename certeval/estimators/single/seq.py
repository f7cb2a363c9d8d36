"""``seq``: the vanilla online evaluation of Wang et al. 2025, arXiv:2505.03814, Algorithm 3.

Random order; after n scores the interval is R̂_n ± ε_n with
ε_n = sqrt({2 ln(ln n + 1) + ln(4/δ)}/n) (Alg. 3 line 3, natural logs), an
adaptive-Hoeffding radius valid at every n simultaneously (Wang et al. 2025, Lemma B.3).
With sub-datasets each one gets ε at level δ/S (see ``strata``).
"""

from __future__ import annotations

from ..protocol import register
from .bounds import seq_radius
from .strata import StratifiedMethod


@register
class SeqMethod(StratifiedMethod):
    """Wang et al. 2025, Alg. 3: uniform random order, radius sqrt({2 ln(ln n + 1) + ln(4/δ)}/n).

    Anytime valid for the i.i.d. mean (Lemma B.3); for ``target='bank'`` the
    interval is also intersected with the bank's deterministic bounds, so it
    closes to the exact mean once every item is scored.
    """

    name = "seq"
    anytime_valid = True
    guarantee_text = "anytime-valid adaptive Hoeffding (Cer-Eval Alg. 3), union bound over sub-datasets"

    def __init__(self, confidence: float = 0.95, target: str = "bank") -> None:
        super().__init__(confidence=confidence, target=target)

    def _stratum_interval(self, h: int) -> tuple[float, float]:
        n = int(self.stratum_n_[h])
        if n == 0:
            return self._clip_to_feasible(h, 0.0, 1.0)
        mean = self._stratum_mean(h)
        radius = seq_radius(n, self._stratum_delta)
        return self._clip_to_feasible(h, mean - radius, mean + radius)
