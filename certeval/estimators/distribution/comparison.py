"""Sequential comparison of two models on paired scores (the same items for both).

Statistic (Arviv et al. 2026, eq. 2 and 5, but paired): the difference of (mean-of-means) scores
``theta_hat = S_A - S_B`` over the items scored so far, with standard error from the
per-item differences ``d_i = a_i - b_i`` (``statistic="paired"``, default) or, for
comparison with Arviv et al.'s public code, the unpaired pooled variance
``(var_a + var_b) / n`` (``statistic="unpaired"``; ignores the positive correlation of
the two models over items, so it is conservative and slower to decide).

Two guarantees:

* ``"group-sequential"`` — repeated confidence intervals ``theta_hat_k +- c_k se_k``
  (Jennison & Turnbull 2000, ch. 9) with ``c_k`` from a boundary of
  :mod:`.boundaries` at information fractions ``n_k / N`` (``N`` = shared bank size);
  simultaneous coverage over the looks, asymptotically (CLT).  Spending functions allow
  unplanned looks; classical Pocock / O'Brien–Fleming assume looks of ``look_size`` items.
* ``"anytime"`` — a confidence sequence for the bank's mean difference (``d_i`` in
  [-1, 1]), the predictable-plug-in empirical-Bernstein CS for sampling *without
  replacement* (Waudby-Smith & Ramdas 2020, "Confidence sequences for sampling without
  replacement", Thm 4; the i.i.d. version is Waudby-Smith & Ramdas 2024, Thm 2):
  valid at any data-dependent stopping time, non-asymptotic.  It shrinks to the exact
  difference when every shared item is scored.

Goals: ``"difference"`` (two-sided, the margin rule of both targets, :func:`pair_verdicts`: stop with
``a>b`` once the interval lies above ``margin``, ``b>a`` below ``-margin``, ``equivalent`` inside
``(-margin, margin)``) and ``"improvement"`` (one-sided "A
beats B by at least ``margin``": stop with ``a>=b+margin`` when the lower bound exceeds
the margin, or for futility when the upper bound falls below it).  For ``"improvement"``
``lower``/``upper`` are two one-sided bounds, each at level ``alpha``.

Finite bank: once every shared item is scored the bank difference is known exactly; the
result says so (``exact``), the verdict is still the test's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..results import Decision, to_jsonable
from ..validation import check_alpha, check_choice, check_positive_int, check_same_length, check_scores
from .boundaries import parse_spending
from .sequential import boundary_multiplier, mean_of_means

GOALS = ("difference", "improvement")
STATISTICS = ("paired", "unpaired")
GUARANTEES = ("group-sequential", "anytime")

UNDECIDED, A_GT_B, B_GT_A, EQUIVALENT, IMPROVED, NOT_IMPROVED, A_OVER_B, B_OVER_A, EITHER_ORDER = range(9)
VERDICTS = ("undecided", "a>b", "b>a", "equivalent", "a>=b+margin", "not a>=b+margin",
            "a>=b-eps", "b>=a-eps", "either order")
RULES = (None, "efficacy", "efficacy", "equivalence", "improvement", "futility", "epsilon", "epsilon", "epsilon")

EXACT_TOL = 1e-9  # floating-point slack when an exact difference is compared with the margin


def pair_verdicts(diff: np.ndarray, lower: np.ndarray, upper: np.ndarray, margin: float,
                  exact: bool) -> np.ndarray:
    """Verdict codes (into ``VERDICTS``) with margin D: a>b once the interval lies above D, b>a below -D,
    equivalent inside (-D, D); at exhaustion the exact difference decides (|diff| <= D: equivalent)."""
    codes = np.full(np.shape(lower if diff is None else diff), UNDECIDED)
    if exact:  # a difference equal to the margin (rational weights: it happens) is not beyond it
        codes[:] = EQUIVALENT
        codes[diff > margin + EXACT_TOL] = A_GT_B
        codes[diff < -margin - EXACT_TOL] = B_GT_A
        return codes
    if margin > 0:
        codes[(lower > -margin) & (upper < margin)] = EQUIVALENT
    codes[lower > margin] = A_GT_B
    codes[upper < -margin] = B_GT_A
    return codes



def epsilon_verdicts(diff: np.ndarray, lower: np.ndarray, upper: np.ndarray, epsilon: float,
                     exact: bool) -> np.ndarray:
    """Indifference-zone statements with tolerance ε (Bechhofer 1954): listing a above b claims
    ``mu_a >= mu_b - ε``, certified once the interval's lower bound exceeds -ε; listing b above a, once its upper
    bound is below ε. Codes: ``EITHER_ORDER`` (both certified), ``A_OVER_B`` / ``B_OVER_A`` (only that listing),
    ``UNDECIDED``; at exhaustion the exact difference decides. An interval narrower than 2ε always certifies one
    listing, so no pair waits for a difference sitting at a boundary."""
    if exact:
        lower = upper = np.asarray(diff, dtype=float)
        tol = EXACT_TOL
    else:
        lower, upper, tol = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float), 0.0
    a_ok, b_ok = lower > -epsilon - tol, upper < epsilon + tol
    codes = np.full(lower.shape, UNDECIDED)
    codes[a_ok] = A_OVER_B
    codes[b_ok] = B_OVER_A
    codes[a_ok & b_ok] = EITHER_ORDER
    return codes


@dataclass(frozen=True)
class Comparison:
    """Result of comparing model A with model B at a look.

    ``diff`` estimates ``S_A - S_B``; ``[lower, upper]`` is the repeated CI (or confidence
    sequence) at that look; ``verdict`` one of ``a>b``, ``b>a``, ``equivalent``,
    ``a>=b+margin``, ``not a>=b+margin``, ``undecided``; ``rule`` the stopping rule that fired
    and ``look`` the look (1-based) at which it fired.  ``guarantee`` says which guarantee
    applies.  ``exact``: every shared item scored, ``diff`` is the bank's exact difference.
    """

    model_a: str
    model_b: str
    n_items: int
    n_total: int
    diff: float
    lower: float
    upper: float
    verdict: str
    rule: str | None
    look: int | None
    guarantee: str
    confidence: float
    statistic: str
    goal: str
    margin: float
    exact: bool = False

    @property
    def done(self) -> bool:
        return self.verdict != "undecided"

    @property
    def decision(self) -> Decision:
        return Decision(self.done, self.rule, self.look, self.done, self.verdict,
                        f"difference {self.diff:.4g} in [{self.lower:.4g}, {self.upper:.4g}]")

    def ci(self) -> tuple[float, float]:
        return (self.lower, self.upper)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["done"] = self.done
        return to_jsonable(out)


@dataclass(frozen=True)
class ComparisonDesign:
    """What is fixed before data arrive: level, goal, margin, statistic, boundary, guarantee.

    ``alpha`` is the total error of the pair (two-sided for ``"difference"``, one-sided
    for ``"improvement"``); ``look_size`` is the planned items per look (classical
    boundaries only).
    """

    alpha: float = 0.05
    goal: str = "difference"
    margin: float = 0.0
    statistic: str = "paired"
    spending: str = "pocock"
    guarantee: str = "group-sequential"
    look_size: int = 100

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        check_choice(self.goal, "goal", GOALS)
        check_choice(self.statistic, "statistic", STATISTICS)
        check_choice(self.guarantee, "guarantee", GUARANTEES)
        parse_spending(self.spending)
        check_positive_int(self.look_size, "look_size")
        if not (0.0 <= float(self.margin) < 1.0) or math.isnan(float(self.margin)):
            raise InputError(f"margin must lie in [0, 1), got {self.margin!r}")
        if self.guarantee == "anytime" and self.statistic != "paired":
            raise InputError("the anytime guarantee (confidence sequence) is for the paired statistic; "
                             f"got statistic={self.statistic!r}")

    @property
    def sides(self) -> int:
        return 2 if self.goal == "difference" else 1

    def describe(self) -> str:
        if self.guarantee == "anytime":
            return (f"anytime-valid: without-replacement empirical-Bernstein confidence sequence "
                    f"(Waudby-Smith & Ramdas), level {1 - self.alpha:g}, any stopping rule")
        return (f"group-sequential: repeated CI (Jennison & Turnbull ch. 9), {self.spending} boundary on n/N, "
                f"{self.statistic} statistic, level {1 - self.alpha:g} over the looks (CLT)")

    # -- the statistic at one look, vectorised over leading axes --------------------------
    def interval(self, a: np.ndarray, b: np.ndarray, look_n: list[int], n_total: int,
                 subsets: np.ndarray | None = None, n_subsets: int | None = None) -> tuple[np.ndarray, ...]:
        """``diff, lower, upper`` at the latest look; ``a``, ``b`` are ``(..., n)`` in scoring order."""
        n = a.shape[-1]
        if self.guarantee == "anytime":
            if subsets is not None:
                raise InputError("the anytime guarantee covers the plain bank mean; use group-sequential for "
                                 "mean-of-means over subsets")
            low, up = wor_confidence_sequence(a - b, n_total, self.alpha, self.sides)
            diff = (a - b).mean(axis=-1) if n else np.full(a.shape[:-1], np.nan)
            return diff, low[..., -1] if n else diff * np.nan, up[..., -1] if n else diff * np.nan
        if self.statistic == "paired":
            diff, var = mean_of_means(a - b, subsets, n_subsets)
        else:
            mean_a, var_a = mean_of_means(a, subsets, n_subsets)
            mean_b, var_b = mean_of_means(b, subsets, n_subsets)
            diff, var = mean_a - mean_b, var_a + var_b
        c = boundary_multiplier(self.spending, self.alpha, look_n, n_total, self.look_size, self.sides)
        half = c * np.sqrt(var)
        return diff, diff - half, diff + half

    def verdict_codes(self, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
        """Stopping verdicts (codes into ``VERDICTS``) from the interval bounds; ``"difference"``: the margin
        rule of both targets (:func:`pair_verdicts`)."""
        lower, upper = np.asarray(lower), np.asarray(upper)
        codes = np.full(lower.shape, UNDECIDED)
        ok = np.isfinite(lower) & np.isfinite(upper)
        if self.goal == "difference":
            codes[ok] = pair_verdicts(None, lower[ok], upper[ok], float(self.margin), exact=False)
        else:
            codes[ok & (upper < self.margin)] = NOT_IMPROVED
            codes[ok & (lower > self.margin)] = IMPROVED
        return codes

    def at(self, a: np.ndarray, b: np.ndarray, look_n: list[int], n_total: int,
           subsets: np.ndarray | None = None, n_subsets: int | None = None) -> tuple[np.ndarray, ...]:
        diff, lower, upper = self.interval(a, b, look_n, n_total, subsets, n_subsets)
        return diff, lower, upper, self.verdict_codes(lower, upper)


def wor_confidence_sequence(diffs: np.ndarray, n_total: int | None, alpha: float, sides: int = 2,
                            truncation: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Running confidence sequence for the mean of ``diffs`` in [-1, 1] (last axis = time).

    Predictable plug-in empirical-Bernstein CS for sampling without replacement from a bank
    of ``n_total`` values (Waudby-Smith & Ramdas 2020, Thm 4; ``n_total=None``: i.i.d.,
    Waudby-Smith & Ramdas 2024, Thm 2), computed on ``x = (d + 1) / 2`` in [0, 1] and
    mapped back.  Each side has error ``alpha / sides``; bounds are intersected over time.
    """
    d = np.asarray(diffs, dtype=float)
    x = (d + 1.0) / 2.0
    n = x.shape[-1]
    i = np.arange(1, n + 1, dtype=float)
    log_term = math.log(sides / alpha)
    # predictable estimates from the first i-1 points (plus a prior point at 1/2)
    csum = np.cumsum(x, axis=-1)
    prev_sum = np.concatenate([np.zeros(x.shape[:-1] + (1,)), csum[..., :-1]], axis=-1)
    mu_prev = (0.5 + prev_sum) / i  # mu_hat_{i-1}
    sq = (x - mu_prev) ** 2
    var_hat = (0.25 + np.cumsum(sq, axis=-1)) / (i + 1)
    var_prev = np.concatenate([np.full(x.shape[:-1] + (1,), 0.25), var_hat[..., :-1]], axis=-1)
    horizon = i if n_total is None else np.minimum(i, n_total)
    lam = np.minimum(np.sqrt(2 * log_term / (var_prev * horizon * np.log1p(horizon))), truncation)
    v = 4.0 * sq
    psi = (-np.log1p(-lam) - lam) / 4.0
    if n_total is None:
        weight = np.ones(n)
        shift = np.zeros_like(x)
    else:
        if n > n_total:
            raise InputError(f"more scores ({n}) than the bank holds ({n_total})")
        remaining = n_total - i + 1  # N - i + 1
        weight = 1.0 + (i - 1) / remaining
        shift = prev_sum / remaining
    denom = np.cumsum(lam * weight, axis=-1)
    center = np.cumsum(lam * (x + shift), axis=-1) / denom
    width = (log_term + np.cumsum(v * psi, axis=-1)) / denom
    lower = np.maximum.accumulate(np.clip(center - width, 0.0, 1.0), axis=-1)
    upper = np.minimum.accumulate(np.clip(center + width, 0.0, 1.0), axis=-1)
    if n_total is not None and n == n_total:  # every item scored: the bank mean is known
        exact = csum[..., -1:] / n_total
        lower[..., -1:] = exact
        upper[..., -1:] = exact
    return 2.0 * lower - 1.0, 2.0 * upper - 1.0


class PairedComparison:
    """Round-protocol comparison of two models on the same items.

    ``update(items, scores_a, scores_b)`` is one look (items are bank positions, shared by
    both models); ``result()`` gives the :class:`Comparison` at the latest look, with the
    verdict, the rule and the look at which it first fired (a decided pair stays decided).
    """

    def __init__(self, model_a: str = "A", model_b: str = "B", *, confidence: float = 0.95,
                 design: ComparisonDesign | None = None) -> None:
        self.model_a, self.model_b = str(model_a), str(model_b)
        alpha = 1.0 - check_alpha(confidence, "confidence")
        self.design = design if design is not None else ComparisonDesign(alpha=alpha)

    def start(self, n_total: int, subsets: np.ndarray | None = None) -> PairedComparison:
        self.n_total = check_positive_int(n_total, "n_total (shared items)")
        self.subsets = None if subsets is None else np.asarray(subsets, dtype=np.int64)
        if self.subsets is not None and self.subsets.shape != (self.n_total,):
            raise InputError(f"subsets must have one code per shared item ({self.n_total}), got {self.subsets.shape}")
        self.n_subsets = None if self.subsets is None else int(self.subsets.max()) + 1
        self.items = np.zeros(0, dtype=np.int64)
        self.a = np.zeros(0)
        self.b = np.zeros(0)
        self.look_n: list[int] = []
        self.stopped: Comparison | None = None
        return self

    def update(self, items: Any, scores_a: Any, scores_b: Any) -> Comparison:
        items = np.asarray(items, dtype=np.int64).reshape(-1)
        sa, sb = check_scores(scores_a, "scores_a"), check_scores(scores_b, "scores_b")
        check_same_length(items, sa, "items", "scores_a")
        check_same_length(items, sb, "items", "scores_b")
        if items.size and (items.min() < 0 or items.max() >= self.n_total):
            raise InputError(f"items must be positions in [0, {self.n_total}), got {int(items.max())}")
        fresh = ~np.isin(items, self.items)
        self.items = np.concatenate([self.items, items[fresh]])
        self.a = np.concatenate([self.a, sa[fresh]])
        self.b = np.concatenate([self.b, sb[fresh]])
        if len(self.items) and (not self.look_n or self.look_n[-1] < len(self.items)):
            self.look_n.append(len(self.items))
        return self.result()

    def result(self) -> Comparison:
        d = self.design
        n = len(self.items)
        if n == 0:
            return self._comparison(float("nan"), -1.0, 1.0, UNDECIDED, None)
        codes = None if self.subsets is None else self.subsets[self.items]
        diff, lower, upper, verdict = d.at(self.a, self.b, self.look_n, self.n_total, codes, self.n_subsets)
        current = self._comparison(float(diff), float(lower), float(upper), int(verdict), len(self.look_n))
        if self.stopped is None and current.done:
            self.stopped = current
        return self.stopped if self.stopped is not None else current

    def _comparison(self, diff, lower, upper, code, look) -> Comparison:
        lower = -1.0 if not math.isfinite(lower) else max(-1.0, lower)
        upper = 1.0 if not math.isfinite(upper) else min(1.0, upper)
        return Comparison(self.model_a, self.model_b, len(self.items), self.n_total, diff, lower, upper,
                          VERDICTS[code], RULES[code], look if code != UNDECIDED else len(self.look_n) or None,
                          self.design.describe(), 1.0 - self.design.alpha, self.design.statistic, self.design.goal,
                          float(self.design.margin), exact=len(self.items) == self.n_total)


def run_sequential_pairs(a: np.ndarray, b: np.ndarray, look_n: list[int], design: ComparisonDesign,
                         n_total: int | None = None, subsets: np.ndarray | None = None,
                         n_subsets: int | None = None) -> dict[str, np.ndarray]:
    """Replay many pairs at once: ``a``, ``b`` are ``(P, n)`` scores in the shared scoring order.

    Looks happen after ``look_n[k]`` items.  Returns per pair the verdict code, the look
    index (1-based, 0 = never decided), items used, and diff / lower / upper at the stop
    (or at the last look).
    """
    a = np.atleast_2d(np.asarray(a, dtype=float))
    b = np.atleast_2d(np.asarray(b, dtype=float))
    n_total = a.shape[-1] if n_total is None else n_total
    pairs = a.shape[0]
    verdict = np.full(pairs, UNDECIDED)
    look = np.zeros(pairs, dtype=np.int64)
    used = np.zeros(pairs, dtype=np.int64)
    out = {k: np.full(pairs, np.nan) for k in ("diff", "lower", "upper")}
    open_ = np.ones(pairs, dtype=bool)
    for k, n in enumerate(look_n):
        if not open_.any():
            break
        idx = np.flatnonzero(open_)
        codes = None if subsets is None else subsets[:n]
        diff, lower, upper, v = design.at(a[idx, :n], b[idx, :n], list(look_n[: k + 1]), n_total, codes, n_subsets)
        out["diff"][idx], out["lower"][idx], out["upper"][idx] = diff, lower, upper
        used[idx] = n
        decided = v != UNDECIDED
        verdict[idx[decided]] = v[decided]
        look[idx[decided]] = k + 1
        open_[idx[decided]] = False
    return {"verdict": verdict, "look": look, "used": used, **out}
