"""Builders and the coverage check of the conformance suite (tests/test_conformance.py).

Every registered single-model method gets a recipe here: its minimal valid parameters and bank (features for
``cer-eval``, a history prior for ``history``, factors for ``faq``) and the targets it answers. Every group
estimator variant (:func:`certeval.estimators.groups.make_group`) gets a :class:`GroupCase`.

The coverage check: ``REPS`` runs, each with looks; a run *misses* when the interval excludes the truth at ANY
look; the check passes iff misses <= ``MAX_MISSES``. ``REPS`` and ``MAX_MISSES`` come from a binomial computation
(:func:`check_power`): at miss rate δ the check passes with probability >= 0.99, at 2δ with probability <= 0.05.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import binom

from certeval.estimators import BankSpec, make_method
from certeval.estimators.faq.factor_model import factor_prior
from certeval.estimators.history.prior import fit_history_prior

DELTA = 0.1  # confidence 0.9
REPS, MAX_MISSES = 200, 30  # the smallest R (with its c) meeting both power conditions at DELTA (check_power)
N_BANK, LOOK = 200, 20  # coverage banks: 200 items, a look every 20 (10 looks)


def check_power(reps: int = REPS, max_misses: int = MAX_MISSES, delta: float = DELTA) -> tuple[float, float]:
    """P(pass | miss rate δ) and P(pass | miss rate 2δ) of the check 'misses <= max_misses out of reps'."""
    return float(binom.cdf(max_misses, reps, delta)), float(binom.cdf(max_misses, reps, 2 * delta))


# --------------------------------------------------------------------------- single-model methods
BANK_ONLY = {"faq", "history"}  # methods that answer the bank's question only (they refuse target='distribution')


def targets_of(name: str) -> tuple[str, ...]:
    return ("bank",) if name in BANK_ONLY else ("bank", "distribution")


def method_params(name: str, n: int, rng: np.random.Generator) -> dict:
    """The minimal valid parameters of each registered method (grids coarsened where a method has one: it
    changes the interval's resolution, not its construction)."""
    if name in ("uniform", "adaptive", "history"):
        return {"grid_size": 513}
    if name == "gst":
        return {"look_size": LOOK}
    if name == "faq":
        k = 3
        mean, cov = factor_prior(rng.normal(0.3, 1.0, (40, k)))
        return {"item_factors": rng.normal(size=(n, k)), "prior_mean": mean, "prior_cov": cov, "budget": n}
    return {}


def bank_spec(name: str, x: np.ndarray, rng: np.random.Generator, subsets: bool = False) -> BankSpec:
    """A bank for ``x`` with what the method needs: features (cer-eval), a history prior (history; other models
    that agree with this one on 80% of the items)."""
    n = x.size
    codes = (np.arange(n) % 3 == 0).astype(np.int64) if subsets else None
    names = ("a", "b") if subsets else ()
    features = rng.normal(size=(n, 2)) + x[:, None] if name == "cer-eval" else None
    history = None
    if name == "history":
        hist = np.where(rng.random((6, n)) < 0.8, x, 1.0 - x)
        history = fit_history_prior(hist, n_factors=2)
    return BankSpec(n, subsets=codes, subset_names=names, features=features, history=history)


def build(name: str, target: str, x: np.ndarray, rng: np.random.Generator, subsets: bool = False):
    """(method started on a bank for ``x``, its spec)."""
    spec = bank_spec(name, x, rng, subsets)
    method = make_method(name, confidence=1 - DELTA, target=target, **method_params(name, x.size, rng))
    return method.start(spec), spec


def run_looks(method, x: np.ndarray, rng: np.random.Generator, looks: int, batch: int = LOOK) -> list:
    """``looks`` rounds of propose / update / result; the estimates in order."""
    out = []
    for _ in range(looks):
        prop = method.propose(batch, rng)
        if len(prop) == 0:
            break
        method.update(prop.items, x[prop.items])
        out.append(method.result())
    return out


class ShrunkInterval:
    """Deliberately miscalibrated control: a method whose interval is shrunk about its mean by ``factor``
    (not registered; it speaks the round protocol by delegating to the method it wraps)."""

    def __init__(self, inner, factor: float = 0.3) -> None:
        self.inner, self.factor = inner, factor

    def start(self, spec):
        self.inner.start(spec)
        return self

    def propose(self, k, rng):
        return self.inner.propose(k, rng)

    def update(self, items, scores):
        self.inner.update(items, scores)

    def result(self):
        from dataclasses import replace

        est = self.inner.result()
        half = self.factor * est.halfwidth
        return replace(est, lower=est.mean - half, upper=est.mean + half)


def misses_with_peeking(make, target: str, p: float, seed: int, reps: int = REPS, n: int = N_BANK,
                        look: int = LOOK) -> int:
    """Runs (out of ``reps``) in which the interval misses the truth at one or more looks. ``make(x, rng)``
    returns a started method for the bank ``x``; the truth is ``p`` on the distribution target (every bank is
    drawn i.i.d. Bernoulli(p)), the bank's estimand on the bank target."""
    misses = 0
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        x = (rng.random(n) < p).astype(float)
        method = make(x, rng)
        truth = p if target == "distribution" else float(method_spec(method).weights() @ x)
        for est in run_looks(method, x, rng, n // look, look):
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                misses += 1
                break
    return misses


def method_spec(method) -> BankSpec:
    return getattr(method, "inner", method).bank_


# --------------------------------------------------------------------------- group estimators
@dataclass(frozen=True)
class GroupCase:
    """One group-estimator variant: a GroupRequest's fields (kind, target, models) and whether it takes history."""

    id: str
    kind: str
    target: str
    models: int = 3
    history: bool = False
    extra: dict = field(default_factory=dict)


GROUP_CASES = (
    GroupCase("compare-bank", "compare", "bank", 2),
    GroupCase("compare-bank-history", "compare", "bank", 2, history=True),
    GroupCase("compare-distribution", "compare", "distribution", 2),
    GroupCase("rank-bank", "rank", "bank"),
    GroupCase("rank-bank-epsilon", "rank", "bank", extra={"epsilon": 0.05}),  # the neighbour construction
    GroupCase("rank-bank-epsilon-all-pairs", "rank", "bank", extra={"epsilon": 0.05, "ranking": "all-pairs"}),
    GroupCase("rank-bank-precision", "rank", "bank", extra={"precision": 0.1}),
    GroupCase("rank-bank-history", "rank", "bank", history=True),
    GroupCase("rank-bank-history-precision", "rank", "bank", history=True, extra={"precision": 0.1}),
    GroupCase("rank-distribution", "rank", "distribution"),
    GroupCase("select-bank", "select", "bank"),
    GroupCase("select-bank-history", "select", "bank", history=True),
    GroupCase("select-distribution-best", "select", "distribution", extra={"mode": "best"}),
    GroupCase("select-distribution-precision", "select", "distribution", extra={"mode": "precision"}),
)
SELECT_MODES = ("best", "precision")

# the 16-close-arms board of select --target distribution: 16 models, expected scores linear between the two ends,
# each run a fresh bank of i.i.d. Bernoulli scores scored in order, a look every CLOSE_LOOK items up to CLOSE_N
CLOSE_ARMS = ((0.75, 0.60), (0.55, 0.40))
CLOSE_MODELS, CLOSE_N, CLOSE_LOOK = 16, 200, 25
CLOSE_GRID = 129  # candidates per betting CS: the interval's resolution (1/128), not its construction
CLOSE_RULES = {"best": (0.02, 0.02), "precision": (None, 0.05)}  # mode: (threshold above the lowest arm, half-width)


def close_arm_selection(board: tuple[float, float], mode: str, **options):
    """A started :class:`~certeval.estimators.distribution.selection.SequentialSelection` for the board at alpha = DELTA
    (``options``: the construction and its design; default the shipped betting one on a :data:`CLOSE_GRID` grid)."""
    from certeval.estimators.distribution.selection import SelectionIntervals, SelectionRule, SequentialSelection

    above, halfwidth = CLOSE_RULES[mode]
    threshold = 0.0 if above is None else board[1] + above
    intervals = SelectionIntervals(**{"grid_size": CLOSE_GRID, "look_size": CLOSE_LOOK, **options})
    return SequentialSelection([f"m{j}" for j in range(CLOSE_MODELS)], n_total=CLOSE_N,
                               rule=SelectionRule(threshold, halfwidth, DELTA, mode), intervals=intervals)


def close_arm_misses(board: tuple[float, float], mode: str, seed: int, reps: int = REPS, **options) -> int:
    """Runs (of ``reps``) in which some model's interval excludes its expected score at one or more looks, up to
    the model's stop (a stopped model's interval stays as it was)."""
    p = np.linspace(board[0], board[1], CLOSE_MODELS)
    misses = 0
    for r in range(reps):
        x = (np.random.default_rng([seed, r]).random((CLOSE_MODELS, CLOSE_N)) < p[:, None]).astype(float)
        sel = close_arm_selection(board, mode, **options)
        for start in range(0, CLOSE_N, CLOSE_LOOK):
            if not sel.running.any():
                break
            sel.update(x[:, start:start + CLOSE_LOOK])
            if ((sel.lower > p + 1e-12) | (sel.upper < p - 1e-12)).any():
                misses += 1
                break
    return misses


def group_request(case: GroupCase, scores: np.ndarray, rng: np.random.Generator, confidence: float = 1 - DELTA,
                  look: int = LOOK):
    from certeval.estimators.groups import GroupRequest

    labels = tuple(f"m{i}" for i in range(scores.shape[0]))
    history = {}
    if case.history:
        for i, label in enumerate(labels):
            hist = np.where(rng.random((6, scores.shape[1])) < 0.8, scores[i], 1.0 - scores[i])
            history[label] = fit_history_prior(hist, n_factors=2)
    fields = {"margin": 0.0, "threshold": 0.1, "halfwidth": 0.1, "look_size": look, **case.extra}
    return GroupRequest(kind=case.kind, labels=labels, target=case.target, confidence=confidence,
                        history=history, **fields)


def play_rounds(rounds, scores: np.ndarray, looks: int | None = None, on_look=None):
    """Drive a started PairedRounds with scores from the matrix (bank positions as columns)."""
    done = 0
    while not rounds.done and (looks is None or done < looks):
        items, _ = rounds.select()
        if not len(items):
            break
        rounds.update(items, {label: scores[rounds.row[label], items] for label in rounds.active})
        rounds.decide()
        done += 1
        if on_look is not None:
            on_look(rounds)
    return rounds
