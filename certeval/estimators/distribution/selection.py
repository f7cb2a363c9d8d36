"""Model / checkpoint selection (Arviv et al. 2026 §7.3.3) on the distribution target: discard the weak early, then
precision or best-model identification.

The estimand is each model's expected score (the bank's items a sample from a population, scored in a uniform random
shared order). Each model gets a confidence sequence for its (mean-of-means) expected score at level ``alpha / M``
(Bonferroni over the M models), so all intervals hold simultaneously with probability >= 1 - alpha, at every look
and hence whenever the run stops. At each look:

1. a model whose upper bound is below ``threshold`` is discarded ("below");
2. ``mode="precision"``: a model whose half-width is <= ``halfwidth`` stops ("precise");
   ``mode="best"``: a model whose upper bound is below the largest lower bound of another
   model cannot be the best and stops ("not-best"); sampling ends when one candidate is left
   or every remaining interval is within ``halfwidth``.

Because every interval holds simultaneously, every discard and every "not-best" is correct
with probability >= 1 - alpha, and the best model is among the candidates.

Two constructions of the per-model intervals (:data:`CONSTRUCTIONS`):

* ``"betting"`` (default, ``exact``): the i.i.d. hedged betting CS of Waudby-Smith & Ramdas (JRSS-B 2024;
  :mod:`.iid_streams`) per model at ``alpha / M``, valid at every item, no approximation; for a mean of sub-dataset
  means, one CS on importance-weighted scores (:meth:`SequentialSelection._weighted`), no union bound over the
  sub-datasets. Bets are tuned to where the run stops: the half-width goal (precision) or the bank's size (best).
* ``"group-sequential"`` (``asymptotic``): Wald intervals with a group-sequential boundary (``spending``) on the
  looks. Normal approximations at ``alpha / M`` on early looks undercover: on 16 Bernoulli arms 0.75 → 0.60 at
  alpha = 0.1, Pocock, looks of 50, some model's interval missed its mean at some look in 127–154 of 1000 runs
  (docs/selection_coverage.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..bank.wor_streams import STREAM_GRID
from ..results import to_jsonable
from ..validation import check_alpha, check_choice, check_in_range, check_positive
from .iid_streams import make_iid_streams
from .sequential import boundary_multiplier

CONSTRUCTIONS = ("betting", "group-sequential")
VALIDITY = {"betting": "exact", "group-sequential": "asymptotic"}
STATUSES = ("running", "below", "precise", "not-best", "candidate", "exhausted")


@dataclass(frozen=True)
class ModelStatus:
    model: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    status: str  # one of STATUSES
    look: int | None

    def ci(self) -> tuple[float, float]:
        return (self.lower, self.upper)


@dataclass(frozen=True)
class Selection:
    """Selected models (those not discarded, best first) with every model's final interval."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[ModelStatus, ...]
    n_total: int
    threshold: float
    halfwidth: float
    mode: str
    alpha: float
    guarantee: str
    validity: str = "exact"  # of the per-model intervals: VALIDITY[construction]

    @property
    def fraction_used(self) -> float:
        return float(sum(m.n_scored for m in self.models)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "selected": list(self.selected),
            "discarded": list(self.discarded),
            "models": [vars(m) | {} for m in self.models],
            "n_total": self.n_total,
            "fraction_used": self.fraction_used,
            "threshold": self.threshold,
            "halfwidth": self.halfwidth,
            "mode": self.mode,
            "alpha": self.alpha,
            "guarantee": self.guarantee,
            "validity": self.validity,
        })


@dataclass(frozen=True)
class SelectionRule:
    """What a selection decides: a model whose upper bound is below ``threshold`` is discarded; ``mode="precision"``
    stops a model once its half-width is <= ``halfwidth``, ``mode="best"`` stops the models that cannot be the best
    (until one is left or all are within ``halfwidth``). Every model's interval is at level ``alpha / M``."""

    threshold: float
    halfwidth: float
    alpha: float = 0.05
    mode: str = "precision"

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_alpha(self.alpha))
        object.__setattr__(self, "threshold", check_in_range(self.threshold, "threshold", 0.0, 1.0))
        object.__setattr__(self, "halfwidth", check_positive(self.halfwidth, "halfwidth"))
        check_choice(self.mode, "mode", ("precision", "best"))


@dataclass(frozen=True)
class SelectionIntervals:
    """How each model's interval is built (:data:`CONSTRUCTIONS`). Betting: ``bet_horizon`` tunes the bets to stop
    after that many items of the shared order (default: the items to reach the half-width in precision mode, the
    bank in best mode; it changes the widths, never the validity), ``grid_size`` candidate means per CS (the
    interval's resolution). Group-sequential: the boundary's ``spending`` and ``look_size``."""

    construction: str = "betting"
    spending: str = "pocock"
    look_size: int = 100
    bet_horizon: int | None = None
    grid_size: int = STREAM_GRID

    def __post_init__(self) -> None:
        check_choice(self.construction, "construction", CONSTRUCTIONS)


def select_models(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], rule: SelectionRule, *,
                  intervals: SelectionIntervals | None = None, subsets: np.ndarray | None = None,
                  n_subsets: int | None = None) -> Selection:
    """Replay selection over ``scores`` (``(M, n)``, columns in the shared scoring order)."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[0] != len(names) or scores.shape[1] == 0:
        raise InputError(f"scores must be (models, items) with one row per name and >= 1 item, got {scores.shape}")
    if np.isnan(scores).any():
        raise InputError("every model must have a score for every shared item")
    n = scores.shape[1]
    looks = [int(x) for x in look_n if 0 < x <= n]
    if not looks:
        raise InputError("no look: look sizes must lie in [1, number of items]")
    sel = SequentialSelection(names, n_total=n, rule=rule, intervals=intervals, subsets=subsets, n_subsets=n_subsets)
    prev = 0
    for n_k in looks:
        if not sel.running.any():
            break
        sel.update(scores[:, prev:n_k])
        prev = n_k
    return sel.result()


class SequentialSelection:
    """:func:`select_models` one look at a time, O(M x new items) per look, never a replay from the first look:
    one running confidence sequence per model (``construction="betting"``) or per model and sub-dataset running
    sums and sums of squares (``"group-sequential"``).

    ``update(block)`` takes the next ``(M, b)`` columns of the shared order (rows of models that stopped are
    ignored); ``result()`` is the :class:`Selection` so far. ``rule``: what is decided (:class:`SelectionRule`);
    ``intervals``: how each model's interval is built (:class:`SelectionIntervals`, default betting).
    """

    def __init__(self, names: Sequence[str], *, n_total: int, rule: SelectionRule,
                 intervals: SelectionIntervals | None = None, subsets: np.ndarray | None = None,
                 n_subsets: int | None = None) -> None:
        self.names = tuple(str(x) for x in names)
        intervals = intervals if intervals is not None else SelectionIntervals()
        self.alpha, self.threshold, self.halfwidth, self.mode = rule.alpha, rule.threshold, rule.halfwidth, rule.mode
        self.construction = intervals.construction
        self.spending, self.look_size, self.n_total = intervals.spending, intervals.look_size, int(n_total)
        m = len(self.names)
        self.codes = None if subsets is None else np.asarray(subsets, dtype=np.int64)
        self.n_sub = 1 if self.codes is None else int(n_subsets if n_subsets is not None else self.codes.max() + 1)
        self.count = np.zeros(self.n_sub)
        self.sums = np.zeros((self.n_sub, m))
        self.squares = np.zeros((self.n_sub, m))
        self.streams = None
        if self.construction == "betting":
            self.scale, self.range, self.joint_end = self._weighted()
            self.streams = self._streams(intervals.bet_horizon, intervals.grid_size)
        self.status = ["running"] * m
        self.look_of: list[int | None] = [None] * m
        self.used = np.zeros(m, dtype=np.int64)
        self.mean = np.full(m, np.nan)
        self.lower = np.zeros(m)
        self.upper = np.ones(m)
        self.looks: list[int] = []
        self.n = 0

    def _streams(self, bet_horizon: int | None, grid_size: int) -> Any:
        """One i.i.d. CS per model at alpha / M on the importance-weighted values (:meth:`_weighted`)."""
        m = len(self.names)
        delta = self.alpha / m
        if bet_horizon is not None:
            horizon = int(bet_horizon)
        elif self.mode == "precision":  # where a CS of a [0, 1] mean reaches ±halfwidth (variance <= 1/4)
            horizon = math.ceil(math.log(2.0 / delta) / (2.0 * self.halfwidth ** 2))
        else:
            horizon = self.n_total
        return make_iid_streams(m, self.n_total, delta, bet_horizon=max(1, min(horizon, self.n_total)),
                                grid_size=grid_size)

    def _weighted(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Per position i of the shared order: the weight ``c_i`` of its value, the range ``B_i`` and the first
        position at which some sub-dataset has no item left (the CSs stop there).

        The order is a uniform permutation fixed independently of the scores, so given everything before position
        i its sub-dataset is s with probability ``r_s/R`` (``r_s`` items of s left of ``R``), and its score has mean
        ``μ_s`` (a fresh draw from s's population). ``y_i = c_i x_i`` with ``c_i = R / (S r_{s_i})`` then has
        conditional mean ``(1/S) Σ_s μ_s`` — the mean of sub-dataset means — while every sub-dataset has items left;
        ``v_i = y_i / B_i`` with ``B_i = R / (S min_s r_s)`` lies in [0, 1] and ``B_i`` is known before draw i. One CS
        per model, no union bound over sub-datasets."""
        n = self.n_total
        if self.codes is None:
            self.present = np.zeros(1, dtype=np.int64)
            return np.ones(n), np.ones(n), n
        codes = self.codes[:n]
        present = self.present = np.flatnonzero(np.bincount(codes, minlength=self.n_sub))
        s = present.size
        onehot = codes[:, None] == present[None, :]
        left = onehot.sum(axis=0)[None, :] - np.cumsum(onehot, axis=0) + onehot  # r_s before each draw
        empty = (left == 0).any(axis=1)
        end = int(np.argmax(empty)) if empty.any() else n
        total_left = (n - np.arange(n)).astype(float)
        with np.errstate(divide="ignore"):
            own = left[np.arange(n), np.argmax(onehot, axis=1)]
            scale = total_left / (s * own)
            rng = total_left / (s * np.maximum(left.min(axis=1), 1))
        return scale, np.maximum(rng, 1.0), end

    @property
    def running(self) -> np.ndarray:
        return np.asarray([s == "running" for s in self.status])

    def _mean_var(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`.sequential.mean_of_means` of the models ``idx`` over the columns seen, from the sums."""
        nan = np.full(len(idx), np.nan)
        if self.codes is None and self.count[0] < 2:
            n0 = self.count[0]
            return (self.sums[0, idx] / n0 if n0 else nan), nan
        if (self.count < 2).any():
            return nan, nan
        means, variances = [], []
        for s in range(self.n_sub):
            n_s = self.count[s]
            su, sq = self.sums[s, idx], self.squares[s, idx]
            var = np.maximum(np.maximum(sq - su * su / n_s, 0.0) / (n_s - 1.0), 1.0 / n_s)  # ddof 1, floor 1/n
            means.append(su / n_s)
            variances.append(var / n_s)
        return np.mean(means, axis=0), np.sum(variances, axis=0) / self.n_sub**2

    def _wald(self, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The group-sequential design's (mean, lower, upper) of the models ``idx`` (infinite before 2 items)."""
        mu, var = self._mean_var(idx)
        c = boundary_multiplier(self.spending, self.alpha / len(self.names), self.looks[: k + 1], self.n_total,
                                self.look_size, 2)
        half = c * np.sqrt(var)
        return mu, mu - half, mu + half

    def _betting(self, idx: np.ndarray, x: np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        """Absorb the look (shared positions ``start`` on) into the CSs of the models ``idx``; their bounds."""
        stop = min(start + x.shape[1], self.joint_end)
        if stop > start:
            cols = slice(start, stop)
            sub = self.streams.rows(idx)
            sub.absorb(x[:, : stop - start] * (self.scale[cols] / self.range[cols]), self.range[cols])
            self.streams.put_rows(idx, sub)
        _, lower, upper = self.streams.bounds()
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.mean([self.sums[s, idx] / self.count[s] if self.count[s] else np.full(idx.size, np.nan)
                          for s in self.present], axis=0)  # the bank's sub-datasets (the estimand's)
        return np.clip(mu, lower[idx], upper[idx]), lower[idx], upper[idx]

    def update(self, block: np.ndarray) -> Selection:
        block = np.asarray(block, dtype=float)
        n_k = self.n + block.shape[1]
        if block.ndim != 2 or block.shape[0] != len(self.names) or n_k > self.n_total:
            raise InputError(f"a look must be (models={len(self.names)}, items) within the {self.n_total} shared "
                             f"items, got {block.shape} after {self.n}")
        k = len(self.looks)
        self.looks.append(n_k)
        codes = np.zeros(block.shape[1], dtype=np.int64) if self.codes is None else self.codes[self.n:n_k]
        self.n = n_k
        idx = np.flatnonzero(self.running)
        if idx.size == 0:
            return self.result()
        x = block[idx]
        if np.isnan(x).any():
            raise InputError("every model still running needs a score for every item of the look")
        if ((x < 0) | (x > 1)).any():
            raise InputError(f"scores must lie in [0, 1], got values in [{x.min()!r}, {x.max()!r}]")
        for s in range(self.n_sub):
            cols = codes == s
            self.count[s] += int(cols.sum())
            self.sums[s, idx] += x[:, cols].sum(axis=1)
            self.squares[s, idx] += (x[:, cols] ** 2).sum(axis=1)
        m, status, look_of = len(self.names), self.status, self.look_of
        mean, lower, upper = self.mean, self.lower, self.upper
        mu, lo, hi = self._betting(idx, x, n_k - x.shape[1]) if self.streams is not None else self._wald(idx, k)
        # the estimand is the expected score (the distribution target): the intervals keep their width when the
        # bank runs out; running out only ends the run
        exhausted = n_k == self.n_total
        mean[idx], self.used[idx] = mu, n_k
        lower[idx] = np.clip(lo, 0, 1)
        upper[idx] = np.clip(hi, 0, 1)
        ok = np.isfinite(hi - lo)
        for j in idx:
            if not ok[np.searchsorted(idx, j)]:
                continue
            if upper[j] < self.threshold:
                status[j], look_of[j] = "below", k + 1
        if self.mode == "precision":
            for j in idx:
                if status[j] == "running" and ok[np.searchsorted(idx, j)] and (upper[j] - lower[j]) / 2 <= self.halfwidth:
                    status[j], look_of[j] = "precise", k + 1
        else:
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            for j in alive:
                best_other = max((lower[i] for i in alive if i != j), default=-np.inf)
                if status[j] == "running" and upper[j] < best_other:
                    status[j], look_of[j] = "not-best", k + 1
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            if len(alive) == 1 or all((upper[j] - lower[j]) / 2 <= self.halfwidth for j in alive):
                for j in alive:
                    status[j], look_of[j] = "candidate", k + 1
        if exhausted:
            for j in range(m):
                if status[j] == "running":
                    status[j], look_of[j] = "exhausted", k + 1
        return self.result()

    @property
    def guarantee(self) -> str:
        m = len(self.names)
        level = 1 - self.alpha / m
        if self.construction == "betting":
            weighted = " on the sub-datasets' importance-weighted scores" if self.n_sub > 1 else ""
            return (f"exact: i.i.d. betting confidence sequences (Waudby-Smith & Ramdas 2024) per model{weighted} at "
                    f"level {level:.4g} (Bonferroni over {m} models), valid at every item: all discards correct "
                    f"with probability >= {1 - self.alpha:g}, whenever the run stops")
        return (f"asymptotic: group-sequential normal (Wald) repeated CIs per model at level {level:.4g} (Bonferroni "
                f"over {m} models, {self.spending} boundary on n/N): all discards correct with probability >= "
                f"{1 - self.alpha:g} only as the normal approximation holds (it undercovers on close models at "
                f"early looks)")

    def result(self) -> Selection:
        m, names, status = len(self.names), self.names, self.status
        keep = [j for j in range(m) if status[j] not in ("below", "not-best")]
        keep.sort(key=lambda j: -self.mean[j])
        return Selection(
            selected=tuple(names[j] for j in keep),
            discarded=tuple(names[j] for j in range(m) if j not in keep),
            models=tuple(ModelStatus(names[j], float(self.mean[j]), float(self.lower[j]), float(self.upper[j]),
                                     int(self.used[j]), status[j], self.look_of[j]) for j in range(m)),
            n_total=self.n_total, threshold=self.threshold, halfwidth=self.halfwidth, mode=self.mode,
            alpha=self.alpha, guarantee=self.guarantee, validity=VALIDITY[self.construction])
