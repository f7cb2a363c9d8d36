"""Sample-size planning for an accuracy estimate to within ±ε (Hayou's sample-size note, "How to Stop Over-Evaluating LLMs").

* worst case (Hayou, §2): n ≥ z²/(4ε²), z the two-sided normal quantile;
* with a known lower bound p ≥ p₀ ≥ ½ on the accuracy: n ≥ z² p₀(1 − p₀)/ε²;
* without replacement from a bank of N items (Cochran 1977, eq. 4.2, finite
  population correction): n_N = n / (1 + (n − 1)/N);
* anytime valid (peek as often as you like, Wang et al. 2025, arXiv:2505.03814 Alg. 3): the smallest n with
  sqrt({2 ln(ln n + 1) + ln(4/δ)}/n) ≤ ε, a Hoeffding-type worst case.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from certeval.errors import InputError

from .single.bounds import seq_radius
from .validation import check_confidence, check_positive, check_positive_int


@dataclass(frozen=True)
class SamplePlan:
    epsilon: float
    confidence: float
    z: float
    n_worst_case: int
    p_bound: float | None = None
    n_p_bound: int | None = None
    bank_size: int | None = None
    n_without_replacement: int | None = None
    n_p_bound_without_replacement: int | None = None
    n_anytime_valid: int | None = None
    anytime_exceeds_bank: bool | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _ceil(x: float) -> int:
    # guard against 2400.0000000001 from floating point
    return int(math.ceil(x - 1e-9))


def finite_population(n: int, bank_size: int) -> int:
    """Cochran's finite-population correction n / (1 + (n − 1)/N), never above N."""
    return min(bank_size, _ceil(n / (1.0 + (n - 1.0) / bank_size)))


def anytime_sample_size(epsilon: float, delta: float) -> int:
    """Smallest n with the Alg. 3 radius ≤ ε (bisection; the radius decreases in n for n ≥ 1)."""
    hi = 1
    while seq_radius(hi, delta) > epsilon:
        hi *= 2
    lo = max(1, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if seq_radius(mid, delta) <= epsilon:
            hi = mid
        else:
            lo = mid + 1
    return lo


def plan_sample_size(epsilon: float, confidence: float = 0.95, p_bound: float | None = None,
                     bank_size: int | None = None) -> SamplePlan:
    """Validate the inputs and return every count of the plan."""
    eps = check_positive(epsilon, "epsilon")
    if eps >= 1:
        raise InputError(f"epsilon must be below 1 for scores in [0, 1], got {epsilon!r}")
    conf = check_confidence(confidence)
    if p_bound is not None:
        try:
            p = float(p_bound)
        except (TypeError, ValueError):
            raise InputError(f"p-bound must be a number in [0.5, 1), got {p_bound!r}") from None
        if not (0.5 <= p < 1.0):
            raise InputError(f"p-bound must lie in [0.5, 1) (a lower bound on accuracy), got {p_bound!r}")
    if bank_size is not None:
        bank_size = check_positive_int(bank_size, "bank-size")
    from scipy.stats import norm  # here: scipy.stats costs every command ~0.7 s at import

    z = float(norm.ppf(1.0 - (1.0 - conf) / 2.0))
    n_worst = _ceil(z * z / (4.0 * eps * eps))
    fields: dict = {"epsilon": eps, "confidence": conf, "z": z, "n_worst_case": n_worst}
    if p_bound is not None:
        fields["p_bound"] = p
        fields["n_p_bound"] = _ceil(z * z * p * (1.0 - p) / (eps * eps))
    if bank_size is not None:
        fields["bank_size"] = bank_size
        fields["n_without_replacement"] = finite_population(n_worst, bank_size)
        if p_bound is not None:
            fields["n_p_bound_without_replacement"] = finite_population(fields["n_p_bound"], bank_size)
        n_any = anytime_sample_size(eps, 1.0 - conf)
        fields["n_anytime_valid"] = min(n_any, bank_size)
        fields["anytime_exceeds_bank"] = n_any > bank_size
    return SamplePlan(**fields)
