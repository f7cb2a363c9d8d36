"""Bank-target comparisons, rankings and selection: without-replacement confidence sequences on a shared
item order, updated look by look (never recomputed from look 1).

The estimand of every statement is the finite bank's own weighted mean ``mu_k = sum_j w_j x_kj`` (``w_j``
= 1/N, or 1/(S N_s) for the mean of S sub-dataset means), and for a pair the exact difference
``mu_a - mu_b``. Every model still in play scores the next items of one order drawn in proportion to the
weights before any score (:func:`~.wor_streams.weighted_order`: a uniform permutation for a plain mean; each
sub-dataset in proportion to its weight otherwise), so each model's scores and each pair's differences
``z = (x_a - x_b + 1)/2`` are a sample without replacement from a finite list, drawn ∝ weight.

Confidence sequences (:mod:`~.wor_streams`): the hedged betting CS of Waudby-Smith & Ramdas (2020 §3, with
the conditional mean ``(m - K)/U`` of a draw ∝ weight) for up to :data:`~.wor_streams.BETTING_CELLS` grid
cells (tens of models), their predictable plug-in empirical-Bernstein CS (Thm 4) beyond. At exhaustion the
list is known, the interval is the exact value.

Family-wise guarantee of a ranking (see docs/ranking.md): each of the P = M(M-1)/2 pair CSs runs at level
``alpha / P`` (two-sided); by the union bound all of them cover their pair's exact difference at every look
with probability >= 1 - alpha, whatever the stopping rule. Every ordering statement the ranking makes
("a>b": lower > margin, "b>a": upper < -margin, "equivalent": interval inside (-margin, margin)) is implied
by a covering interval, so the probability that *any* statement is wrong is <= alpha. Models leave as soon
as all their pairs are decided; stopping is free for a confidence sequence. The per-model intervals printed
beside the ranking are simultaneous at ``alpha / M``.

ε-statements (``epsilon``; ``epsilon_method="tests"``, the default): each pair's two listings are certified by
the two one-sided betting tests of :mod:`.epsilon_tests` (H_A: ``Δ <= -ε``, H_B: ``Δ >= ε``), each at level
``alpha / P``. The two nulls of a pair are disjoint, so at most one is true and the pair certifies a false
listing with probability <= alpha/P at any stopping time; by the union bound over the P pairs every certified
listing is true with probability >= 1 - alpha. The pair intervals are still computed and reported (each a CS at
``alpha / P``; the O(1) empirical-Bernstein construction whatever M, since they do not decide).
``epsilon_method="intervals"`` certifies from those intervals instead (:func:`~certeval.estimators.distribution.comparison.epsilon_verdicts`;
the method before the tests, kept for comparison and for runs stored with it).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..distribution.comparison import (
    A_GT_B,
    A_OVER_B,
    B_GT_A,
    B_OVER_A,
    EITHER_ORDER,
    RULES,
    UNDECIDED,
    VERDICTS,
    Comparison,
    epsilon_verdicts,
    pair_verdicts,
)
from ..distribution.ranking import PairOutcomes, Ranking
from ..validation import check_alpha, check_in_range
from .epsilon_tests import EpsilonTests, test_verdicts
from .wor_streams import WorStreams, absorb_rows, check_weights, make_streams, streams_from_state

PAIR_BLOCK_CELLS = 1 << 22  # pairs x items absorbed at once

TARGETS = ("bank", "distribution")
EPSILON_METHODS = ("tests", "intervals")  # how ε-listings are certified (see BankRanking)

GUARANTEE = ("bank target, anytime-valid: without-replacement betting confidence sequences (Waudby-Smith & "
             "Ramdas 2020; empirical-Bernstein beyond tens of models) on the paired differences of the bank's "
             "weighted means, items drawn in proportion to their weights; exact once every item is scored")


def look_arrays(names: Sequence[str], items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """A look of the shared order as arrays: bank positions ``(b,)`` and scores ``(models, b)`` (checked)."""
    items = np.asarray(items, dtype=np.int64).reshape(-1)
    x = np.asarray(scores, dtype=float)
    if x.shape != (len(names), items.size):
        raise InputError(f"scores must be (models={len(names)}, items={items.size}), got {x.shape}")
    return items, x


def checked_look(names: Sequence[str], items: Any, scores: Any, n: int, n_total: int,
                 model_open: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A look of a ranking checked against the bank (``n`` items seen of ``n_total``): bank positions, scores and
    the rows of the models still open; None for an empty look."""
    items, x = look_arrays(names, items, scores)
    if items.size and (items.min() < 0 or items.max() >= n_total):
        raise InputError(f"items must be bank positions in [0, {n_total}), got {int(items.max())}")
    if n + items.size > n_total:
        raise InputError(f"more items ({n + items.size}) than the bank holds ({n_total})")
    if items.size == 0:
        return None
    live = np.flatnonzero(model_open)
    if np.isnan(x[live]).any() or (x[live] < 0).any() or (x[live] > 1).any():
        raise InputError("every model still in play needs a score in [0, 1] for every item of the look")
    return items, x, live


@dataclass(frozen=True, eq=False)
class BankPairTable(PairOutcomes):
    """:class:`~certeval.estimators.distribution.ranking.PairOutcomes` of the bank target's pairs at one
    ``confidence``, with the ``margin`` (or ε) of their verdicts and the ranking's ``guarantee``. ``board_pairs`` and
    ``board_decided``: the board's totals where the table holds only some pairs (a neighbour ranking's opened ones)."""

    confidence: float
    margin: float
    guarantee: str
    board_pairs: int | None = None
    board_decided: int | None = None

    @property
    def n_pairs_total(self) -> int:
        return len(self) if self.board_pairs is None else self.board_pairs

    @property
    def n_decided_total(self) -> int:
        return int(self.decided.sum()) if self.board_decided is None else self.board_decided

    def comparison(self, p: int) -> Comparison:
        code = int(self.verdict[p])
        rule = "exhausted" if code != UNDECIDED and self.used[p] == self.n_total else RULES[code]
        return Comparison(self.names[self.a[p]], self.names[self.b[p]], int(self.used[p]), self.n_total,
                          float(self.diff[p]), float(self.lower[p]), float(self.upper[p]), VERDICTS[code], rule,
                          int(self.look[p]) or None, self.guarantee, self.confidence, "paired-wor", "difference",
                          float(self.margin), exact=bool(self.used[p] == self.n_total))


def consistent_order(means: np.ndarray, names: Sequence[str], a: np.ndarray, b: np.ndarray,
                     verdict: np.ndarray) -> list[int]:
    """Models best first by mean, moved only where a directional verdict says otherwise (topological sort
    with the mean as priority), so no model is listed above one it was certified worse than."""
    order = sorted(range(len(names)), key=lambda k: (-means[k], names[k]))
    pos = np.empty(len(names), dtype=np.int64)
    pos[order] = np.arange(len(names))
    win = np.where(verdict == A_GT_B, a, b)
    lose = np.where(verdict == A_GT_B, b, a)
    directional = np.isin(verdict, (A_GT_B, B_GT_A))
    win, lose = win[directional], lose[directional]
    if not (pos[win] > pos[lose]).any():
        return order
    m = len(names)
    indeg = np.bincount(lose, minlength=m)
    by_winner = np.argsort(win, kind="stable")
    starts = np.searchsorted(win[by_winner], np.arange(m + 1))
    heap = [(pos[k], k) for k in range(m) if indeg[k] == 0]
    heapq.heapify(heap)
    out, seen = [], np.zeros(m, dtype=bool)
    while len(out) < m:
        if not heap:  # a cycle (possible only if some statement is wrong): fall back to the mean order
            k = next(k for k in order if not seen[k])
            indeg[k] = 0
            heapq.heappush(heap, (pos[k], k))
        _, k = heapq.heappop(heap)
        if seen[k]:
            continue
        seen[k] = True
        out.append(int(k))
        for e in by_winner[starts[k]:starts[k + 1]]:
            j = lose[e]
            indeg[j] -= 1
            if indeg[j] == 0 and not seen[j]:
                heapq.heappush(heap, (pos[j], j))
    return out


def group_ties(order: Sequence[int], separated_from: Any) -> list[list[int]]:
    """Tie groups in ranking order: a model joins the current group unless some member of it was separated
    from it by a directional verdict. Two models separated by a verdict are therefore never in one group
    (at exhaustion: never two models whose exact means differ by more than the margin)."""
    groups: list[list[int]] = []
    for k in order:
        if groups and not separated_from(k, groups[-1]):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def epsilon_groups(means: np.ndarray, names: Sequence[str], a: np.ndarray, b: np.ndarray,
                   verdict: np.ndarray) -> list[list[int]]:
    """Tie groups of an ε-ranking, best first: the strongly connected components of the graph of required
    listings (x → y when only "x above y" is certified; both ways for a pair still undecided), in a topological
    order that puts the higher mean first where the statements leave a choice; members by mean. Every pair in two
    different groups is then listed in an order its statement certifies; within a group nothing is claimed."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    m = len(names)
    fwd, bwd, open_ = verdict == A_OVER_B, verdict == B_OVER_A, verdict == UNDECIDED
    src = np.concatenate([a[fwd], b[bwd], a[open_], b[open_]]).astype(np.int64)
    dst = np.concatenate([b[fwd], a[bwd], b[open_], a[open_]]).astype(np.int64)
    graph = coo_matrix((np.ones(len(src)), (src, dst)), shape=(m, m))
    n_groups, label = connected_components(graph, directed=True, connection="strong")
    best = np.full(n_groups, -np.inf)
    np.maximum.at(best, label, means)
    cross = label[src] != label[dst]
    gs, gd = label[src][cross], label[dst][cross]
    indeg = np.bincount(gd, minlength=n_groups)
    by_src = np.argsort(gs, kind="stable")
    starts = np.searchsorted(gs[by_src], np.arange(n_groups + 1))
    heap = [(-best[g], g) for g in range(n_groups) if indeg[g] == 0]
    heapq.heapify(heap)
    members = [[] for _ in range(n_groups)]
    for k in sorted(range(m), key=lambda k: (-means[k], names[k])):
        members[label[k]].append(k)
    out = []
    while heap:
        _, g = heapq.heappop(heap)
        out.append(members[g])
        for e in by_src[starts[g]:starts[g + 1]]:
            indeg[gd[e]] -= 1
            if indeg[gd[e]] == 0:
                heapq.heappush(heap, (-best[gd[e]], gd[e]))
    return out


def assemble_ranking(table: BankPairTable, model_mean: np.ndarray, model_used: np.ndarray, *, alpha: float,
                     correction: str = "bonferroni", epsilon: float | None = None, halfwidth: float | None = None):
    """A :class:`~certeval.estimators.distribution.ranking.Ranking` from every pair's verdict and each model's bank-mean estimate: order
    consistent with the verdicts, tie groups with no two separated members (ε-statements: see
    :func:`epsilon_groups`)."""
    names = table.names
    means = np.where(np.isnan(model_mean), -np.inf, model_mean)
    if epsilon is not None:
        groups = epsilon_groups(means, names, table.a, table.b, table.verdict)
    else:
        order = consistent_order(means, names, table.a, table.b, table.verdict)
        sep = np.zeros((len(names), len(names)), dtype=bool)
        d = np.isin(table.verdict, (A_GT_B, B_GT_A))
        sep[table.a[d], table.b[d]] = True
        sep[table.b[d], table.a[d]] = True
        groups = group_ties(order, lambda k, group: bool(sep[k, group].any()))
    order = [k for g in groups for k in g]
    return Ranking(
        models=tuple(names[k] for k in order),
        tie_groups=tuple(tuple(names[k] for k in g) for g in groups),
        means=tuple(float(model_mean[k]) for k in order),
        items_used=tuple(int(model_used[k]) for k in order),
        n_total=table.n_total, pairs=table, alpha=alpha, correction=correction, guarantee=table.guarantee,
        epsilon=epsilon, halfwidth=halfwidth)


class ModelBoard:
    """What a bank-target ranking keeps for the models of its board: their names (at least two, unique), the
    family level ``alpha`` and its ``correction``, the weights ``w`` of the shared order's positions, and each
    model's running confidence sequence (``models``) with its items, mean and bounds, frozen once the model leaves.
    :class:`BankRanking` and :class:`~.neighbour_ranking.NeighbourRanking` add the pairs."""

    def __init__(self, names: Sequence[str], alpha: float, correction: str) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 2:
            raise InputError(f"a ranking needs at least two models, got {len(self.names)}")
        if len(set(self.names)) != len(self.names):
            raise InputError("model names must be unique")
        self.alpha = check_alpha(alpha)
        if correction not in ("bonferroni", "none"):
            raise InputError(f"correction must be bonferroni or none, got {correction!r}")
        self.correction = correction

    def _start_models(self, m: int) -> None:
        self.model_open = np.ones(m, dtype=bool)
        self.model_used = np.zeros(m, dtype=np.int32)
        self.model_mean = np.full(m, np.nan)
        self.model_lower = np.zeros(m)
        self.model_upper = np.ones(m)

    @property
    def n_total(self) -> int:
        return int(self.w.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in np.flatnonzero(self.model_open)]

    def _absorb_models(self, live: np.ndarray, y: np.ndarray, w: np.ndarray, items: np.ndarray) -> None:
        # a model that left is frozen: only the live rows absorb the look (items: for a subclass's predictions)
        absorb_rows(self.models, live, y[live], w, self._model_controls(live, items))
        self.model_used[live] = self.n
        mean, lower, upper = self.models.bounds()
        self.model_mean[live], self.model_lower[live], self.model_upper[live] = mean[live], lower[live], upper[live]

    def _model_controls(self, live: np.ndarray, items: np.ndarray) -> np.ndarray | None:
        """The look's control variate for the live models' streams, their predicted rest set first (none here; the
        history ranking has one)."""
        return None

    def model_intervals(self) -> dict[str, tuple[float, float, float, int]]:
        """Per model: (mean, lower, upper, items) — the models' simultaneous CSs for the bank means."""
        return {n: (float(self.model_mean[k]), float(self.model_lower[k]), float(self.model_upper[k]),
                    int(self.model_used[k])) for k, n in enumerate(self.names)}


class BankRanking(ModelBoard):
    """Incremental bank-target ranking of M models over a shared item order drawn ∝ weight.

    ``start(weights)``, then ``update(items, scores)`` once per look with the bank positions of the next
    items of the shared order and a ``(M, b)`` score block (rows of models that left are ignored; NaN is
    fine there). ``result()`` gives a :class:`~certeval.estimators.distribution.ranking.Ranking`; ``active`` the models still sampled.
    ``state()`` / ``from_state()`` carry everything (arrays and scalars; JSON/npz-able).
    """

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, margin: float = 0.0,
                 correction: str = "bonferroni", epsilon: float | None = None,
                 epsilon_method: str = "tests") -> None:
        if epsilon_method not in EPSILON_METHODS:
            raise InputError(f"epsilon_method must be one of {EPSILON_METHODS}, got {epsilon_method!r}")
        super().__init__(names, alpha, correction)
        self.epsilon_method = epsilon_method
        self.tests = None
        self.margin = check_in_range(margin, "margin", 0.0, 1.0)
        if epsilon is not None:  # ε-statements (see epsilon_verdicts) instead of the margin's strict ones
            epsilon = check_in_range(epsilon, "epsilon", 0.0, 1.0)
            if not 0.0 < epsilon < 1.0 or self.margin:
                raise InputError(f"epsilon must lie in (0, 1) and replaces the margin, got epsilon={epsilon!r} "
                                 f"with margin={self.margin!r}")
        self.epsilon = epsilon

    # -- life cycle -------------------------------------------------------------------------------------
    def start(self, weights: np.ndarray, bet_horizon: int | None = None) -> BankRanking:
        """``weights``: the estimand's item weights in the positions ``update`` receives; the order of the items
        must be drawn ∝ these weights (:func:`~.wor_streams.weighted_order`). ``bet_horizon``: the run's item
        budget, if any (bets tuned to stop there; any value keeps the guarantee)."""
        self.w = check_weights(weights)
        n_total = self.w.size
        m = len(self.names)
        a, b = np.triu_indices(m, k=1)
        p = len(a)
        pair_alpha = self.alpha / p if self.correction == "bonferroni" else self.alpha
        self.tests = (EpsilonTests(p, n_total, pair_alpha, self.epsilon)
                      if self.epsilon is not None and self.epsilon_method == "tests" else None)
        # the tests decide: the reported pair intervals are the O(1) empirical-Bernstein CSs (no betting grid)
        self.pairs = (make_streams(p, n_total, pair_alpha, bet_horizon) if self.tests is None
                      else WorStreams(p, n_total, pair_alpha))
        self.models = make_streams(m, n_total, self.alpha / m, bet_horizon)
        self.open_a, self.open_b = a.astype(np.int32), b.astype(np.int32)
        self.open_idx = np.arange(p, dtype=np.int64)
        self.pa, self.pb = a.astype(np.int32), b.astype(np.int32)
        self.verdict = np.full(p, UNDECIDED, dtype=np.int8)
        self.look = np.zeros(p, dtype=np.int32)
        self.used = np.zeros(p, dtype=np.int32)
        self.diff = np.full(p, np.nan)
        self.lower = np.full(p, -1.0)
        self.upper = np.full(p, 1.0)
        self._start_models(m)
        self.n = 0
        self.looks = 0
        return self

    def _begin_look(self, items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """A look checked and counted, the running models' intervals updated: (items, live models, scores with
        0 for the rows of models that left, weights); None for an empty look."""
        look = checked_look(self.names, items, scores, self.n, self.n_total, self.model_open)
        if look is None:
            return None
        items, x, live = look
        w = self.w[items]
        self.n += items.size
        self.looks += 1
        y = np.where(np.isnan(x), 0.0, x)
        self._absorb_models(live, y, w, items)
        return items, live, y, w

    def update(self, items: Any, scores: Any) -> BankRanking:
        look = self._begin_look(items, scores)
        if look is None:
            return self
        items, live, y, w = look
        if len(self.open_idx):  # z = (x_a - x_b + 1)/2, in slices: a (pairs x items) block would not fit at M ~ 2000
            step = max(1, PAIR_BLOCK_CELLS // len(self.open_idx))
            for s in range(0, y.shape[1], step):
                yc = y[:, s:s + step]
                z = (yc[self.open_a] - yc[self.open_b] + 1.0) / 2.0
                self.pairs.absorb(z, w[s:s + step])
                if self.tests is not None:
                    self.tests.absorb(z, w[s:s + step])
            self._decide_pairs()
        return self

    def _decide_pairs(self) -> None:
        ps = self.pairs
        mean, lo, up = ps.bounds()
        diff, lower, upper = 2 * mean - 1, 2 * lo - 1, 2 * up - 1
        exact = self.n == self.n_total
        if self.epsilon is None:
            codes = pair_verdicts(diff, lower, upper, self.margin, exact)
        elif self.tests is None or exact:
            codes = epsilon_verdicts(diff, lower, upper, self.epsilon, exact)
        else:  # the boundary tests decide; the intervals are reported beside them
            codes = test_verdicts(self.tests.rejected_a, self.tests.rejected_b)
        idx = self.open_idx
        self.diff[idx], self.used[idx] = diff, self.n
        self.lower[idx], self.upper[idx] = np.maximum(lower, -1.0), np.minimum(upper, 1.0)
        done = codes != UNDECIDED
        self.look[idx[done & (self.verdict[idx] == UNDECIDED)]] = self.looks
        self.verdict[idx[done]] = codes[done]
        if self.tests is not None and not exact:
            self._keep_tracking(done, codes)
            return
        if done.any():
            keep = ~done
            ps.keep(keep)
            if self.tests is not None:
                self.tests.keep(keep)
            self.open_idx, self.open_a, self.open_b = idx[keep], self.open_a[keep], self.open_b[keep]
            still = np.zeros(len(self.names), dtype=bool)
            still[self.open_a] = True
            still[self.open_b] = True
            self.model_open &= still

    def _keep_tracking(self, done: np.ndarray, codes: np.ndarray) -> None:
        """ε-tests: a model leaves once every pair of it has a certified listing, but a settled pair whose two
        models are both still sampled (for other pairs) keeps testing at no cost in cells, so that its other
        listing may be certified too (both listings: no constraint on the order, fewer merged tie groups).
        Rejections only accumulate; the union bound covers every rejection at any time."""
        idx = self.open_idx
        undecided = ~done
        still = np.zeros(len(self.names), dtype=bool)
        still[self.open_a[undecided]] = True
        still[self.open_b[undecided]] = True
        self.model_open &= still
        keep = self.model_open[self.open_a] & self.model_open[self.open_b] & (codes != EITHER_ORDER)
        if not keep.all():
            self.pairs.keep(keep)
            self.tests.keep(keep)
            self.open_idx, self.open_a, self.open_b = idx[keep], self.open_a[keep], self.open_b[keep]

    # -- result -----------------------------------------------------------------------------------------
    def guarantee(self) -> str:
        p = len(self.pa)
        how = (f"Bonferroni over the {p} pairs (each at alpha/{p})" if self.correction == "bonferroni"
               else "NO multiplicity correction (demonstration only: no family-wise control)")
        what = "every ordering statement" if self.epsilon is None else (
            f"the epsilon-statements: every model listed in a higher tie group has a bank mean at least that of "
            f"every model in a lower group minus {self.epsilon:g},")
        if self.tests is not None:
            return (f"{GUARANTEE} (reported beside the listings); the listings are certified by two one-sided "
                    f"without-replacement betting tests per pair (mu_a - mu_b <= -{self.epsilon:g} and >= "
                    f"{self.epsilon:g}; disjoint nulls, each test at the pair's level), anytime-valid, exact at "
                    f"exhaustion; family-wise over {what} by {how}")
        return f"{GUARANTEE}; family-wise over {what} by {how}"

    def pair_table(self) -> BankPairTable:
        return BankPairTable(self.names, self.pa, self.pb, self.verdict.astype(np.int64), self.look, self.used,
                             self.diff, self.lower, self.upper, self.n_total, 1.0 - self.alpha,
                             self.margin if self.epsilon is None else self.epsilon, self.guarantee())

    def result(self):
        return assemble_ranking(self.pair_table(), self.model_mean, self.model_used, alpha=self.alpha,
                                correction=self.correction, epsilon=self.epsilon)

    # -- state ------------------------------------------------------------------------------------------
    ARRAYS = ("w", "open_a", "open_b", "open_idx", "pa", "pb", "verdict", "look", "used", "diff", "lower", "upper",
              "model_open", "model_used", "model_mean", "model_lower", "model_upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "bank-ranking", "names": list(self.names), "alpha": self.alpha, "margin": self.margin,
                "correction": self.correction, "epsilon": self.epsilon, "n": self.n, "looks": self.looks,
                "pairs": self.pairs.state(), "models": self.models.state(), "epsilon_method": self.epsilon_method,
                "tests": None if self.tests is None else self.tests.state(),
                **{k: getattr(self, k).copy() for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BankRanking:
        obj = cls(state["names"], alpha=float(state["alpha"]), margin=float(state["margin"]),
                  correction=str(state["correction"]), epsilon=state.get("epsilon"),
                  epsilon_method=str(state.get("epsilon_method", "intervals")))
        obj.n, obj.looks = int(state["n"]), int(state["looks"])
        tests = state.get("tests")
        obj.tests = None if tests is None else EpsilonTests.from_state(tests)
        obj.pairs = streams_from_state(state["pairs"])
        obj.models = streams_from_state(state["models"])
        for k in cls.ARRAYS:
            setattr(obj, k, np.asarray(state[k]).copy())
        return obj


def bank_rank(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], *, alpha: float = 0.05,
              margin: float = 0.0, weights: np.ndarray | None = None, correction: str = "bonferroni"):
    """Replay a bank-target ranking over ``scores`` (``(M, N)``, columns in the shared order, the whole bank)
    with looks after ``look_n[k]`` items; ``weights`` per column (default 1/N), the order drawn ∝ them
    (:func:`~.wor_streams.weighted_order`)."""
    scores = np.asarray(scores, dtype=float)
    m, n = scores.shape
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=float)
    rank = BankRanking(names, alpha=alpha, margin=margin, correction=correction).start(w)
    prev = 0
    for n_k in look_n:
        n_k = min(int(n_k), n)
        if n_k <= prev:
            continue
        rank.update(np.arange(prev, n_k), scores[:, prev:n_k])
        prev = n_k
        if not rank.model_open.any():
            break
    return rank
