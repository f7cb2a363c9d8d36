"""ε-correct rankings whose work grows with the pairs that matter: per-model confidence sequences settle the pairs
far apart, pair tests are opened only for the neighbours those intervals leave unsettled.

Statement (as :class:`~.ranking.BankRanking` with ``epsilon``): every model listed in a higher tie group has a
bank mean at least that of every model in a lower group minus ε, jointly with probability ≥ 1 − α, at any stopping
time. Family-wise argument (docs/ranking.md, "ε-rankings at leaderboard scale"):

* α is split before any data: ``α_M = s·α`` for the model family, ``α_P = (1 − s)·α`` for the pair family
  (``s`` = ``model_share``).
* **Model family.** Each of the M models has a without-replacement CS for its bank mean at level ``α_M / M``
  (two-sided; :mod:`~.wor_streams`). Event ``E_M``: all cover at every look; ``P(E_M^c) ≤ α_M``.
  On ``E_M`` "a above b" holds whenever ``lower_a + ε ≥ upper_b``.
* **Pair family.** Each of the ``P = M(M − 1)/2`` pairs of the board *has* — whether or not it is ever computed —
  two one-sided tests (H_A: ``Δ ≤ −ε``, H_B: ``Δ ≥ ε``; disjoint nulls) at level ``δ = α_P / P``, a share fixed
  before any data. Each test is a fixed function of the shared order's scores from the first item
  (:class:`~.epsilon_tests.EpsilonTests` or :class:`~.look_tests.LookTests`). Event ``E_P``: no test of any
  pair ever rejects a true null; ``P(E_P^c) ≤ P·δ = α_P`` (Ville per test, union bound over the P pairs).
* **Opening is free.** Which pairs' tests are *computed* depends on the data (those whose models are both still
  sampled and that the model CSs leave unsettled); a test opened at look t is replayed from the first item of the
  order, so its path is the path it would have had from the start. ``E_P`` is an event about all P tests, computed
  or not, so reading only some of them, chosen by any rule, cannot make it less likely; the union bound is over
  the pairs that *can* be opened — all P — with shares fixed in advance.
* On ``E_M ∩ E_P`` (probability ≥ 1 − α) every certified listing is true; the tie groups list two models in
  different groups only in an order a certificate supports, so every statement of the ranking is true.

Work: a model's CS costs O(1) per item (the betting CS up to :data:`MODEL_BETTING_CELLS` model × item cells, the
empirical-Bernstein CS beyond); a pair is computed only once the intervals leave it unsettled, i.e. for neighbours
within about ``2·halfwidth − ε`` of each other. Candidates are enumerated among the running models sorted by
interval midpoint: a pair is unsettled only if ``|mid_a − mid_b| < (w_a + w_b)/2 − ε`` (w the widths), so each
model's candidates are a window of that order. Each running model's two neighbours in that order (its *probes*, the
last pairs to settle) are opened at every look; once both are settled, every unsettled pair of its window is opened
(at most ``open_budget`` candidates per look). A model cannot leave before its probes settle and late pairs are
replayed, so this delays no model. Beyond :data:`BETTING_PAIRS_MAX` pairs the pair tests are
:class:`~.look_tests.LookTests` (bets fixed per look: O(1) per pair and look beside one bit count of two packed score
rows); scores are kept (O(M·N), bit-packed when 0/1) so a late pair can be replayed. Memory O(M·N + pairs opened).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..distribution.comparison import A_OVER_B, B_OVER_A, EITHER_ORDER, UNDECIDED
from ..validation import check_in_range
from .epsilon_tests import EpsilonTests
from .look_tests import LookTests, look_coefficients
from .neighbour_groups import neighbour_groups
from .pair_replay import ScoreStore, feed_look
from .ranking import BankPairTable, ModelBoard, checked_look
from .wor_streams import (
    BETTING_CELLS,
    STREAM_GRID,
    BettingStreams,
    WorStreams,
    check_weights,
    streams_from_state,
)

MODEL_SHARE = 0.1  # share of alpha spent on the per-model CSs (the rest on the pairs)
# pair tests: per-item betting tests (EpsilonTests) up to this many pairs on the board, per-look tests beyond
BETTING_PAIRS_MAX = 60_000
# per-model CSs: the betting CS (a grid per model, ~25 passes over it per item) up to this many model x item cells
# (openllm_tiny's 1,989 x 493 = 980,577), the O(1) empirical-Bernstein CS beyond (2,000 x 10,000 took 100 CPU-s
# with betting grids, most of the run)
MODEL_BETTING_CELLS = 5_000_000
OPEN_BUDGET = 4_000_000  # candidate pairs enumerated at one look at most
FULL_TABLE_MAX = 2_500_000  # boards up to this many pairs report every pair; beyond, the opened ones
PAIR_TESTS = ("auto", "betting", "look")

GUARANTEE = ("bank target, anytime-valid: per-model without-replacement confidence sequences (Waudby-Smith & "
             "Ramdas 2020) settle the pairs far apart; one-sided pair tests on the paired differences of the bank's "
             "weighted means, opened only for the neighbours the intervals leave unsettled and replayed from the "
             "first item; items drawn in proportion to their weights; exact once every item is scored")


class NeighbourRanking(ModelBoard):
    """Incremental ε-correct bank-target ranking of M models (see the module docstring): the interface of
    :class:`~.ranking.BankRanking` (``start``, ``update(items, scores)``, ``active``, ``result()``,
    ``model_intervals()``, ``state()`` / ``from_state()``); the model CSs at ``model_share · alpha / M``."""

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, epsilon: float, correction: str = "bonferroni",
                 model_share: float = MODEL_SHARE, pair_tests: str = "auto", open_budget: int = OPEN_BUDGET) -> None:
        super().__init__(names, alpha, correction)
        epsilon = check_in_range(epsilon, "epsilon", 0.0, 1.0)
        if not 0.0 < epsilon < 1.0:
            raise InputError(f"epsilon must lie in (0, 1), got {epsilon!r}")
        self.epsilon = epsilon
        self.model_share = check_in_range(model_share, "model_share", 0.0, 1.0)
        if not 0.0 < self.model_share < 1.0:
            raise InputError(f"model_share must lie in (0, 1), got {model_share!r}")
        if pair_tests not in PAIR_TESTS:
            raise InputError(f"pair_tests must be one of {PAIR_TESTS}, got {pair_tests!r}")
        m = len(self.names)
        self.n_pairs = m * (m - 1) // 2
        self.pair_tests = pair_tests if pair_tests != "auto" else (
            "betting" if self.n_pairs <= BETTING_PAIRS_MAX else "look")
        self.open_budget = int(open_budget)
        self.margin = 0.0

    # -- levels -----------------------------------------------------------------------------------------
    @property
    def model_level(self) -> float:
        a = self.model_share * self.alpha
        return a / len(self.names) if self.correction == "bonferroni" else a

    @property
    def pair_level(self) -> float:
        a = (1.0 - self.model_share) * self.alpha
        return a / self.n_pairs if self.correction == "bonferroni" else a

    # -- life cycle -------------------------------------------------------------------------------------
    def start(self, weights: np.ndarray, bet_horizon: int | None = None) -> NeighbourRanking:
        self.w = check_weights(weights)
        m = len(self.names)
        n = self.w.size
        self.models = (BettingStreams(m, n, self.model_level, bet_horizon=bet_horizon)
                       if m * STREAM_GRID <= BETTING_CELLS and m * n <= MODEL_BETTING_CELLS
                       else WorStreams(m, n, self.model_level))
        self.store = ScoreStore()
        self.engine = self._new_engine(0)
        self.live = np.zeros(0, dtype=np.int64)  # opened-pair index of each test the engine holds
        # every opened pair (in opening order): models, certified listings, look settled, items used
        self.pa = np.zeros(0, dtype=np.int32)
        self.pb = np.zeros(0, dtype=np.int32)
        self.rej_a = np.zeros(0, dtype=bool)
        self.rej_b = np.zeros(0, dtype=bool)
        self.look = np.zeros(0, dtype=np.int32)
        self.used = np.zeros(0, dtype=np.int32)
        self.diff = np.zeros(0)  # the pair's running estimate of the difference (its tests' mean of z, rescaled)
        self._start_models(m)
        self.pending = np.ones(m, dtype=bool)  # may have an unsettled pair not opened
        self.enumerated = np.zeros(m, dtype=bool)  # every unsettled pair of the model is opened
        self._keys = None
        self.remaining = 1.0
        self.n = 0
        self.looks = 0
        self.replayed_pair_items = 0
        return self

    def _new_engine(self, k: int) -> Any:
        if self.pair_tests == "betting":
            return EpsilonTests(k, self.w.size, self.pair_level, self.epsilon)
        return LookTests(k, self.w.size, self.pair_level, self.epsilon)

    @property
    def n_opened(self) -> int:
        return len(self.pa)

    def update(self, items: Any, scores: Any) -> NeighbourRanking:
        look = checked_look(self.names, items, scores, self.n, self.n_total, self.model_open)
        if look is None:
            return self
        items, x, live = look
        w = self.w[items]
        y = np.zeros_like(x)
        y[live] = x[live]  # rows of models that left: never read
        _, g, _ = look_coefficients(w, self.remaining)
        self.store.add(y, w, g)
        self.n += items.size
        self.looks += 1
        self.remaining = 0.0 if self.n == self.n_total else max(self.remaining - float(w.sum()), 0.0)
        self._absorb_models(live, y, w, items)
        k = len(self.store) - 1
        # the live pairs' tests take the look (an empty engine counts it, to stay in step with the order)
        feed_look(self.engine, self.store, k, self.pa[self.live], self.pb[self.live])
        if len(self.live):
            self.rej_a[self.live] = self.engine.rejected_a
            self.rej_b[self.live] = self.engine.rejected_b
            self.used[self.live] = self.n
            self.diff[self.live] = 2.0 * self.engine.total / max(self.engine.n, 1) - 1.0
        self._open_unsettled()
        self._decide()
        return self

    # -- opening ----------------------------------------------------------------------------------------
    def _candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The running models sorted by interval midpoint, and each one's window ``[lo, hi)`` of candidate partners
        in that order: a pair is unsettled only if ``|mid_a − mid_b| < (w_a + w_b)/2 − ε`` (w the widths), so its
        partners lie within ``(w_a + max w)/2 − ε`` of its midpoint (``hi − lo − 1`` bounds its unsettled pairs)."""
        act = np.flatnonzero(self.model_open)
        lo_, up_ = self.model_lower[act], self.model_upper[act]
        mid, width = (lo_ + up_) / 2.0, up_ - lo_
        s = np.argsort(mid, kind="stable")
        ms, ws = mid[s], width[s]
        pos = np.arange(len(ms))
        if not len(ms):
            return act[s], pos, pos
        radius = (ws + ws.max()) / 2.0 - self.epsilon
        hi = np.searchsorted(ms, ms + radius, side="left")
        lo = np.searchsorted(ms, ms - radius, side="right")
        hi = np.where(radius > 0, np.maximum(hi, pos + 1), pos + 1)
        lo = np.where(radius > 0, np.minimum(lo, pos), pos)
        return act[s], lo, hi

    def _lookup(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Index of each pair (a, b) among the opened pairs, −1 where not opened."""
        m = len(self.names)
        if self._keys is None:
            keys = self.pa.astype(np.int64) * m + self.pb
            self._key_order = np.argsort(keys, kind="stable")
            self._keys = keys[self._key_order]
        q = np.minimum(a, b).astype(np.int64) * m + np.maximum(a, b)
        if not len(self._keys):
            return np.full(len(q), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._keys, q), len(self._keys) - 1)
        return np.where(self._keys[at] == q, self._key_order[at], -1)

    def _settled(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Pairs with a certified listing (model CSs, or an opened pair's tests)."""
        cert_a, cert_b = self.certified(a, b)
        idx = self._lookup(a, b)
        hit = idx >= 0
        return cert_a | cert_b | (hit & (self.rej_a[np.where(hit, idx, 0)] | self.rej_b[np.where(hit, idx, 0)]))

    def _open_unsettled_pairs(self, a: np.ndarray, b: np.ndarray) -> int:
        """Open the pairs (a, b) the model CSs leave unsettled and not opened yet; returns how many."""
        lo_, up_ = self.model_lower, self.model_upper
        unsettled = (up_[b] > lo_[a] + self.epsilon) & (up_[a] > lo_[b] + self.epsilon)
        a, b = a[unsettled], b[unsettled]
        a, b = np.minimum(a, b), np.maximum(a, b)
        if len(a):
            keys = np.unique(a.astype(np.int64) * len(self.names) + b)
            a, b = keys // len(self.names), keys % len(self.names)
            fresh = self._lookup(a, b) < 0
            a, b = a[fresh], b[fresh]
        if len(a):
            self._open(a.astype(np.int32), b.astype(np.int32))
        return len(a)

    def _open_unsettled(self) -> None:
        """Probes, then whole windows: each running model's neighbours in midpoint order (its closest pairs, the
        last to settle) are opened first; once a model's probes are settled every unsettled pair of its window is
        opened (replayed, so no pair loses any draw), at most ``open_budget`` candidates per look. A model can leave
        only after its probes settle, so opening the rest then delays nothing."""
        act, lo, hi = self._candidates()
        count = hi - lo - 1
        self.enumerated[act[count == 0]] = True
        if len(act) > 1:
            self._open_unsettled_pairs(act[:-1], act[1:])
            settled = self._settled(act[:-1], act[1:])
            ready = np.ones(len(act), dtype=bool)
            ready[:-1] &= settled
            ready[1:] &= settled
            todo = np.flatnonzero(ready & ~self.enumerated[act] & (count > 0))
            todo = todo[np.argsort(count[todo], kind="stable")]
            take = todo[np.cumsum(count[todo]) <= self.open_budget]
            if len(take):
                self._open_unsettled_pairs(*_window_pairs(act, lo, hi, take))
                self.enumerated[act[take]] = True
        self.pending = self.model_open & ~self.enumerated

    def unopened_unsettled(self, limit: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The pairs of pending models that no certificate settles and no test covers (undecided), or None if
        their windows hold more than ``limit`` candidates."""
        act, lo, hi = self._candidates()
        take = np.flatnonzero(self.pending[act])
        if int((hi[take] - lo[take]).sum()) > limit:
            return None
        a, b = _window_pairs(act, lo, hi, take)
        lo_, up_ = self.model_lower, self.model_upper
        unsettled = (up_[b] > lo_[a] + self.epsilon) & (up_[a] > lo_[b] + self.epsilon)
        a, b = a[unsettled], b[unsettled]
        fresh = self._lookup(a, b) < 0
        return a[fresh], b[fresh]

    def _open(self, a: np.ndarray, b: np.ndarray) -> None:
        """Open the tests of pairs (a, b), replayed over every look so far: the path each would have had from the
        first item."""
        new = self._new_engine(len(a))
        for k in range(len(self.store)):
            feed_look(new, self.store, k, a, b)
        self.replayed_pair_items += len(a) * self.n
        first = len(self.pa)
        self.engine.extend(new)
        self.live = np.concatenate([self.live, first + np.arange(len(a))])
        self.pa, self.pb = np.concatenate([self.pa, a]), np.concatenate([self.pb, b])
        self.rej_a = np.concatenate([self.rej_a, new.rejected_a])
        self.rej_b = np.concatenate([self.rej_b, new.rejected_b])
        self.look = np.concatenate([self.look, np.zeros(len(a), dtype=np.int32)])
        self._keys = None
        self.used = np.concatenate([self.used, np.full(len(a), self.n, dtype=np.int32)])
        self.diff = np.concatenate([self.diff, 2.0 * new.total / max(new.n, 1) - 1.0])

    # -- decisions --------------------------------------------------------------------------------------
    def certified(self, a: np.ndarray, b: np.ndarray, rej_a: np.ndarray | None = None,
                  rej_b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """("a above b" certified, "b above a" certified) from the model CSs and, for opened pairs, the tests."""
        lo_, up_ = self.model_lower, self.model_upper
        cert_a = lo_[a] + self.epsilon >= up_[b]
        cert_b = lo_[b] + self.epsilon >= up_[a]
        if rej_a is not None:
            cert_a, cert_b = cert_a | rej_a, cert_b | rej_b
        return cert_a, cert_b

    def _decide(self) -> None:
        if self.n == self.n_total:  # exact intervals: every pair has a certified listing
            self.model_open[:] = False
            self.pending[:] = False
        live = self.live
        cert_a, cert_b = self.certified(self.pa[live], self.pb[live], self.rej_a[live], self.rej_b[live])
        settled = cert_a | cert_b
        newly = settled & (self.look[live] == 0)
        self.look[live[newly]] = self.looks
        if self.n < self.n_total:
            needed = self.pending.copy()
            open_pairs = ~settled
            needed[self.pa[live[open_pairs]]] = True
            needed[self.pb[live[open_pairs]]] = True
            self.model_open &= needed
        # a settled pair whose models are both still sampled keeps testing (its other listing may come too)
        keep = self.model_open[self.pa[live]] & self.model_open[self.pb[live]] & ~(cert_a & cert_b)
        if not keep.all():
            self.engine.keep(keep)
            self.live = live[keep]

    # -- result -----------------------------------------------------------------------------------------
    def guarantee(self) -> str:
        m, p = len(self.names), self.n_pairs
        s = self.model_share
        if self.correction == "bonferroni":
            how = (f"alpha split before any data: {s:g} alpha over the {m} model CSs (each at {s:g} alpha/{m}), "
                   f"{1 - s:g} alpha over all {p} pairs (each pair's two tests at {1 - s:g} alpha/{p}, disjoint "
                   f"nulls), whether or not a pair is ever opened; union bound")
        else:
            how = "NO multiplicity correction (demonstration only: no family-wise control)"
        tests = ("per-item betting tests" if self.pair_tests == "betting"
                 else "empirical-Bernstein tests with bets fixed per look")
        return (f"{GUARANTEE}; pair tests: {tests}; family-wise over the epsilon-statements: every model listed in "
                f"a higher tie group has a bank mean at least that of every model in a lower group minus "
                f"{self.epsilon:g}, by {how}")

    def groups(self) -> list[list[int]]:
        """Tie groups, best first (see :func:`neighbour_groups`)."""
        means = np.where(np.isnan(self.model_mean), -np.inf, self.model_mean)
        cert_a, cert_b = self.certified(self.pa, self.pb, self.rej_a, self.rej_b)
        return neighbour_groups(self, means, cert_a, cert_b)

    def pair_table(self) -> BankPairTable:
        """Every pair (boards up to :data:`FULL_TABLE_MAX` pairs) or the opened ones, with the listing certified
        (model CSs or tests), the estimate (an opened pair's own mean difference over the items it saw; else the
        models' estimates) and the interval the model CSs imply for the difference (simultaneous, level share·α)."""
        m = len(self.names)
        full = self.n_pairs <= FULL_TABLE_MAX
        if full:
            a, b = np.triu_indices(m, k=1)
            ra, rb = np.zeros(len(a), dtype=bool), np.zeros(len(a), dtype=bool)
            look = np.zeros(len(a), dtype=np.int64)
            diff = self.model_mean[a] - self.model_mean[b]
            used = np.minimum(self.model_used[a], self.model_used[b])
            if len(self.pa):
                pidx = _triu_index(self.pa.astype(np.int64), self.pb.astype(np.int64), m)
                ra[pidx], rb[pidx], look[pidx] = self.rej_a, self.rej_b, self.look
                diff[pidx], used[pidx] = self.diff, self.used
        else:
            a, b, ra, rb, look = self.pa, self.pb, self.rej_a, self.rej_b, self.look.astype(np.int64)
            diff, used = self.diff, self.used
        cert_a, cert_b = self.certified(a, b, ra, rb)
        verdict = np.full(len(a), UNDECIDED, dtype=np.int64)
        verdict[cert_a] = A_OVER_B
        verdict[cert_b] = B_OVER_A
        verdict[cert_a & cert_b] = EITHER_ORDER
        lower = np.maximum(self.model_lower[a] - self.model_upper[b], -1.0)
        upper = np.minimum(self.model_upper[a] - self.model_lower[b], 1.0)
        decided = int((verdict != UNDECIDED).sum()) if full else self.n_pairs - self._unsettled_count()
        return BankPairTable(self.names, a, b, verdict, look, used, diff, lower, upper, self.n_total, 1.0 - self.alpha,
                             self.epsilon, self.guarantee(), board_pairs=self.n_pairs, board_decided=decided)

    def _unsettled_count(self) -> int:
        """Pairs without a certified listing (an upper bound from the windows while some pair is pending)."""
        cert_a, cert_b = self.certified(self.pa, self.pb, self.rej_a, self.rej_b)
        opened = int((~(cert_a | cert_b)).sum())
        if self.pending.any():
            act, lo, hi = self._candidates()
            return opened + int((hi - lo - 1)[self.pending[act]].sum())
        return opened

    def result(self):
        from ..distribution.ranking import Ranking

        groups = self.groups()
        order = [k for g in groups for k in g]
        names = self.names
        return Ranking(models=tuple(names[k] for k in order),
                       tie_groups=tuple(tuple(names[k] for k in g) for g in groups),
                       means=tuple(float(self.model_mean[k]) for k in order),
                       items_used=tuple(int(self.model_used[k]) for k in order), n_total=self.n_total,
                       pairs=self.pair_table(), alpha=self.alpha, correction=self.correction,
                       guarantee=self.guarantee(), epsilon=self.epsilon)

    # -- state ------------------------------------------------------------------------------------------
    ARRAYS = ("w", "live", "pa", "pb", "rej_a", "rej_b", "look", "used", "diff", "model_open", "pending", "enumerated",
              "model_used",
              "model_mean", "model_lower", "model_upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "neighbour-ranking", "names": list(self.names), "alpha": self.alpha, "epsilon": self.epsilon,
                "correction": self.correction, "model_share": self.model_share, "pair_tests": self.pair_tests,
                "open_budget": self.open_budget, "n": self.n, "looks": self.looks, "remaining": self.remaining,
                "replayed_pair_items": self.replayed_pair_items, "models": self.models.state(),
                "engine": self.engine.state(), "store": self.store.state(),
                **{k: getattr(self, k).copy() for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> NeighbourRanking:
        obj = cls(state["names"], alpha=float(state["alpha"]), epsilon=float(state["epsilon"]),
                  correction=str(state["correction"]), model_share=float(state["model_share"]),
                  pair_tests=str(state["pair_tests"]), open_budget=int(state["open_budget"]))
        obj.n, obj.looks, obj.remaining = int(state["n"]), int(state["looks"]), float(state["remaining"])
        obj.replayed_pair_items = int(state["replayed_pair_items"])
        obj.models = streams_from_state(state["models"])
        engine = state["engine"]
        obj.engine = (EpsilonTests.from_state(engine) if engine.get("construction") == "epsilon-tests"
                      else LookTests.from_state(engine))
        obj.store = ScoreStore.from_state(state["store"])
        for k in cls.ARRAYS:
            setattr(obj, k, np.asarray(state[k]).copy())
        obj._keys = None
        return obj


def _window_pairs(act: np.ndarray, lo: np.ndarray, hi: np.ndarray, take: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(model, partner) for every partner in the windows ``[lo, hi)`` of the sorted positions ``take`` (itself
    excluded); models ``act`` in that order."""
    span = hi[take] - lo[take]
    i = np.repeat(take, span)
    j = np.repeat(lo[take], span) + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    return act[i[j != i]], act[j[j != i]]


def _triu_index(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Index of pair (a, b), a < b, in ``np.triu_indices(m, k=1)`` order."""
    return a * (2 * m - a - 1) // 2 + (b - a - 1)


__all__ = ["NeighbourRanking", "ScoreStore", "neighbour_groups", "MODEL_SHARE"]
