"""Bank-target comparisons, rankings and selection: without-replacement confidence sequences on a shared
uniform item order, updated look by look (never recomputed from look 1).

The estimand of every statement is the finite bank's own weighted mean ``mu_k = sum_j w_j x_kj`` (``w_j``
= 1/N, or 1/(S N_s) for the mean of S sub-dataset means), and for a pair the exact difference
``mu_a - mu_b``. Every model still in play scores the next items of one uniform permutation of the bank, so
each model's scores and each pair's differences are a sample *without replacement* from a finite list.

Confidence sequence (Waudby-Smith & Ramdas 2020, "Confidence sequences for sampling without replacement",
Thm 4 — the predictable plug-in empirical-Bernstein CS): for values ``x_i`` in [0, 1] drawn without
replacement from a list of N, with ``lambda_i`` predictable,

    C_t = [ (sum lambda_i (x_i + S_{i-1}/(N-i+1))) / D_t  +-  (log(2/a) + sum v_i psi(lambda_i)) / D_t ],
    D_t = sum lambda_i (1 + (i-1)/(N-i+1)),  v_i = 4 (x_i - muhat_{i-1})^2,  psi(l) = (-log(1-l) - l)/4,

covers the list's mean at every t simultaneously with probability >= 1 - a. It is the estimator
:func:`certeval.estimators.comparison.wor_confidence_sequence` computes in one pass; :class:`WorStreams`
keeps its running sums so a look costs O(streams x new items). The weighted estimand enters through
``y_j = N w_j x_j`` (a list whose plain mean is ``mu``), rescaled to [0, 1] by ``c = N max_j w_j``; a pair's
``y_j = N w_j (x_aj - x_bj)`` in [-c, c] maps to ``(y/c + 1)/2``. At exhaustion the list is known, the
interval is the exact value.

Family-wise guarantee of a ranking (see docs/ranking.md): each of the P = M(M-1)/2 pair CSs runs at level
``alpha / P`` (two-sided); by the union bound all of them cover their pair's exact difference at every look
with probability >= 1 - alpha, whatever the stopping rule. Every ordering statement the ranking makes
("a>b": lower > margin, "b>a": upper < -margin, "equivalent": interval inside (-margin, margin)) is implied
by a covering interval, so the probability that *any* statement is wrong is <= alpha. Models leave as soon
as all their pairs are decided; stopping is free for a confidence sequence. The per-model intervals printed
beside the ranking are simultaneous at ``alpha / M``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._validation import InputError, check_alpha, check_in_range, check_positive_int
from .comparison import A_GT_B, B_GT_A, EQUIVALENT, RULES, UNDECIDED, VERDICTS, Comparison
from .results import to_jsonable

TARGETS = ("bank", "distribution")
TRUNCATION = 0.5  # lambda_i <= 1/2, as in wor_confidence_sequence
EXACT_TOL = 1e-9  # floating-point slack when an exact difference is compared with the margin

GUARANTEE = ("bank target, anytime-valid: without-replacement empirical-Bernstein confidence sequences "
             "(Waudby-Smith & Ramdas 2020) on the paired differences of the bank's weighted means; exact once "
             "every item is scored")


class WorStreams:
    """Running without-replacement empirical-Bernstein CSs for K streams of values in [0, 1].

    Every stream sees the same number of values (the shared order); :meth:`absorb` takes a ``(K, b)``
    block of the next ``b`` values. :meth:`keep` drops streams that no longer need updating.
    Identical to :func:`~certeval.estimators.comparison.wor_confidence_sequence` value by value.
    """

    FIELDS = ("total", "sq", "denom", "num", "vpsi", "lower", "upper")

    def __init__(self, k: int, n_total: int, log_term: float) -> None:
        self.n_total = int(n_total)
        self.log_term = float(log_term)
        self.n = 0
        self.total = np.zeros(k)  # sum of x so far
        self.sq = np.zeros(k)  # sum of (x_i - muhat_{i-1})^2
        self.denom = np.zeros(k)
        self.num = np.zeros(k)
        self.vpsi = np.zeros(k)
        self.lower = np.zeros(k)
        self.upper = np.ones(k)

    def __len__(self) -> int:
        return len(self.total)

    def absorb(self, x: np.ndarray, intersect: str = "item") -> None:
        """The next ``b`` values of every stream, ``(K, b)``. ``intersect``: ``"item"`` keeps the running
        intersection after every value (as the one-pass estimator), ``"look"`` only at the end of the block
        (also a valid CS — an intersection over fewer times — and a third cheaper)."""
        x = np.asarray(x, dtype=float)
        if x.ndim != 2 or x.shape[0] != len(self):
            raise InputError(f"a block of values must be (streams={len(self)}, items), got {x.shape}")
        for col in range(x.shape[1]):
            self.absorb_column(x[:, col], intersect == "item" or col == x.shape[1] - 1)

    def absorb_column(self, xi: np.ndarray, intersect: bool = True) -> None:
        """One more value per stream (``(K,)``)."""
        big_n = self.n_total
        if self.n >= big_n:
            raise InputError(f"more values than the bank holds ({big_n})")
        i = self.n + 1
        mu_prev = (0.5 + self.total) / i
        var_prev = (0.25 + self.sq) / i  # var_hat_{i-1} = (0.25 + sum_{k<i} sq_k) / i
        h = min(i, big_n)
        lam = np.sqrt((2.0 * self.log_term / (h * math.log1p(h))) / var_prev)
        np.minimum(lam, TRUNCATION, out=lam)
        remaining = big_n - i + 1
        dev = xi - mu_prev
        dev *= dev
        self.denom += lam * (1.0 + (i - 1) / remaining)
        self.num += lam * (xi + self.total / remaining)
        self.vpsi += dev * (-np.log1p(-lam) - lam)  # v_i psi(lambda_i) = 4 dev (-log(1-l) - l) / 4
        self.sq += dev
        self.total += xi
        self.n = i
        if i == big_n:  # the whole list is known
            self.lower = self.total / big_n
            self.upper = self.lower.copy()
        elif intersect:
            center = self.num / self.denom
            width = (self.log_term + self.vpsi) / self.denom
            np.maximum(self.lower, np.clip(center - width, 0.0, 1.0), out=self.lower)
            np.minimum(self.upper, np.clip(center + width, 0.0, 1.0), out=self.upper)

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sample mean, lower, upper)`` of each stream on the [0, 1] scale."""
        mean = self.total / self.n if self.n else np.full(len(self), np.nan)
        return mean, self.lower.copy(), self.upper.copy()

    def keep(self, mask: np.ndarray) -> None:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f)[mask])

    def state(self) -> dict[str, Any]:
        return {"n_total": self.n_total, "log_term": self.log_term, "n": self.n,
                **{f: getattr(self, f).copy() for f in self.FIELDS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "WorStreams":
        obj = cls(0, int(state["n_total"]), float(state["log_term"]))
        obj.n = int(state["n"])
        for f in cls.FIELDS:
            setattr(obj, f, np.asarray(state[f], dtype=float))
        return obj


def absorb_rows(streams: WorStreams, rows: np.ndarray, block: np.ndarray, n_before: int) -> None:
    """Absorb ``block`` into the streams ``rows`` only, which have seen ``n_before`` values (the others are
    frozen where their model left)."""
    if len(rows) == 0:
        return
    sub = WorStreams(0, streams.n_total, streams.log_term)
    sub.n = int(n_before)
    for f in WorStreams.FIELDS:
        setattr(sub, f, getattr(streams, f)[rows])
    sub.absorb(block)
    for f in WorStreams.FIELDS:
        getattr(streams, f)[rows] = getattr(sub, f)
    streams.n = sub.n


def look_arrays(names: Sequence[str], items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """A look of the shared order as arrays: bank positions ``(b,)`` and scores ``(models, b)`` (checked)."""
    items = np.asarray(items, dtype=np.int64).reshape(-1)
    x = np.asarray(scores, dtype=float)
    if x.shape != (len(names), items.size):
        raise InputError(f"scores must be (models={len(names)}, items={items.size}), got {x.shape}")
    return items, x


def item_scale(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """``u_j = N w_j`` (the list whose plain mean is the weighted mean) and its range ``c = max u``."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size == 0 or (w < 0).any() or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise InputError(f"weights must be non-negative and sum to one over the bank, got sum {float(w.sum())!r}")
    u = w * w.size
    return u, float(u.max())


def pair_verdicts(diff: np.ndarray, lower: np.ndarray, upper: np.ndarray, margin: float,
                  exact: bool) -> np.ndarray:
    """Verdict codes (into ``VERDICTS``) with margin D: a>b once the interval lies above D, b>a below -D,
    equivalent inside (-D, D); at exhaustion the exact difference decides (|diff| <= D: equivalent)."""
    codes = np.full(np.shape(diff), UNDECIDED)
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


class BankPairTable:
    """Every pair's verdict, look, items and interval, in the shape :class:`~.ranking.Ranking` reads."""

    def __init__(self, names: tuple[str, ...], a: np.ndarray, b: np.ndarray, verdict: np.ndarray, look: np.ndarray,
                 used: np.ndarray, diff: np.ndarray, lower: np.ndarray, upper: np.ndarray, n_total: int,
                 confidence: float, margin: float, guarantee: str) -> None:
        self.names, self.a, self.b = names, a, b
        self.verdict, self.look, self.used = verdict, look, used
        self.diff, self.lower, self.upper = diff, lower, upper
        self.n_total, self.confidence, self.margin, self.guarantee = n_total, confidence, margin, guarantee

    def __len__(self) -> int:
        return len(self.a)

    @property
    def decided(self) -> np.ndarray:
        return self.verdict != UNDECIDED

    def comparison(self, p: int) -> Comparison:
        code = int(self.verdict[p])
        rule = "exhausted" if code != UNDECIDED and self.used[p] == self.n_total else RULES[code]
        return Comparison(self.names[self.a[p]], self.names[self.b[p]], int(self.used[p]), self.n_total,
                          float(self.diff[p]), float(self.lower[p]), float(self.upper[p]), VERDICTS[code], rule,
                          int(self.look[p]) or None, self.guarantee, self.confidence, "paired-wor", "difference",
                          float(self.margin), exact=bool(self.used[p] == self.n_total))

    def columns(self) -> dict[str, Any]:
        names = np.asarray(self.names, dtype=object)
        return {"model_a": names[self.a], "model_b": names[self.b],
                "verdict": np.asarray(VERDICTS, dtype=object)[self.verdict],
                "rule": np.asarray(RULES, dtype=object)[self.verdict], "look": self.look.astype(np.int64),
                "n_items": self.used.astype(np.int64), "diff": self.diff, "lower": self.lower, "upper": self.upper}


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


def assemble_ranking(table: BankPairTable, model_mean: np.ndarray, model_used: np.ndarray, *, alpha: float,
                     correction: str = "bonferroni"):
    """A :class:`~.ranking.Ranking` from every pair's verdict and each model's bank-mean estimate: order
    consistent with the verdicts, tie groups with no two separated members."""
    from .ranking import Ranking

    names = table.names
    means = np.where(np.isnan(model_mean), -np.inf, model_mean)
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
        n_total=table.n_total, pairs=table, alpha=alpha, correction=correction, guarantee=table.guarantee)


class BankRanking:
    """Incremental bank-target ranking of M models over a shared uniform item order.

    ``start(weights)``, then ``update(items, scores)`` once per look with the bank positions of the next
    items of the shared order and a ``(M, b)`` score block (rows of models that left are ignored; NaN is
    fine there). ``result()`` gives a :class:`~.ranking.Ranking`; ``active`` the models still sampled.
    ``state()`` / ``from_state()`` carry everything (arrays and scalars; JSON/npz-able).
    """

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, margin: float = 0.0,
                 correction: str = "bonferroni") -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 2:
            raise InputError(f"a ranking needs at least two models, got {len(self.names)}")
        if len(set(self.names)) != len(self.names):
            raise InputError("model names must be unique")
        self.alpha = check_alpha(alpha)
        self.margin = check_in_range(margin, "margin", 0.0, 1.0)
        if correction not in ("bonferroni", "none"):
            raise InputError(f"correction must be bonferroni or none, got {correction!r}")
        self.correction = correction

    # -- life cycle -------------------------------------------------------------------------------------
    def start(self, weights: np.ndarray) -> "BankRanking":
        self.u, self.c = item_scale(weights)
        n_total = self.u.size
        m = len(self.names)
        a, b = np.triu_indices(m, k=1)
        p = len(a)
        pair_alpha = self.alpha / p if self.correction == "bonferroni" else self.alpha
        self.pairs = WorStreams(p, n_total, math.log(2.0 / pair_alpha))
        self.models = WorStreams(m, n_total, math.log(2.0 * m / self.alpha))
        self.open_a, self.open_b = a.astype(np.int32), b.astype(np.int32)
        self.open_idx = np.arange(p, dtype=np.int64)
        self.pa, self.pb = a.astype(np.int32), b.astype(np.int32)
        self.verdict = np.full(p, UNDECIDED, dtype=np.int8)
        self.look = np.zeros(p, dtype=np.int32)
        self.used = np.zeros(p, dtype=np.int32)
        self.diff = np.full(p, np.nan)
        self.lower = np.full(p, -1.0)
        self.upper = np.full(p, 1.0)
        self.model_open = np.ones(m, dtype=bool)
        self.model_used = np.zeros(m, dtype=np.int32)
        self.model_mean = np.full(m, np.nan)
        self.model_lower = np.zeros(m)
        self.model_upper = np.ones(m)
        self.n = 0
        self.looks = 0
        return self

    @property
    def n_total(self) -> int:
        return int(self.u.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in np.flatnonzero(self.model_open)]

    def update(self, items: Any, scores: Any) -> "BankRanking":
        items, x = look_arrays(self.names, items, scores)
        if items.size and (items.min() < 0 or items.max() >= self.n_total):
            raise InputError(f"items must be bank positions in [0, {self.n_total}), got {int(items.max())}")
        if self.n + items.size > self.n_total:
            raise InputError(f"more items ({self.n + items.size}) than the bank holds ({self.n_total})")
        if items.size == 0:
            return self
        live = np.flatnonzero(self.model_open)
        if np.isnan(x[live]).any() or (x[live] < 0).any() or (x[live] > 1).any():
            raise InputError("every model still in play needs a score in [0, 1] for every item of the look")
        u = self.u[items]
        self.n += items.size
        self.looks += 1
        # models: y = u x in [0, c]
        y = np.where(np.isnan(x), 0.0, x) * u / self.c
        self._absorb_models(live, y)
        # open pairs: d = u (x_a - x_b) in [-c, c] -> [0, 1]
        if len(self.open_idx):  # column by column: a (pairs x items) block would not fit at M ~ 2000
            last = y.shape[1] - 1
            for col in range(y.shape[1]):
                yc = y[:, col]
                d = yc[self.open_a] - yc[self.open_b]
                d += 1.0
                d *= 0.5
                self.pairs.absorb_column(d, intersect=col == last)
            self._decide_pairs()
        return self

    def _absorb_models(self, live: np.ndarray, y: np.ndarray) -> None:
        # a model that left is frozen: only the live rows absorb the look
        absorb_rows(self.models, live, y[live], self.n - y.shape[1])
        self.model_used[live] = self.n
        self.model_mean[live] = self.c * self.models.total[live] / self.n
        self.model_lower[live] = self.c * self.models.lower[live]
        self.model_upper[live] = np.minimum(1.0, self.c * self.models.upper[live])

    def _decide_pairs(self) -> None:
        ps = self.pairs
        mean, lo, up = ps.bounds()
        diff, lower, upper = self.c * (2 * mean - 1), self.c * (2 * lo - 1), self.c * (2 * up - 1)
        exact = self.n == self.n_total
        codes = pair_verdicts(diff, lower, upper, self.margin, exact)
        idx = self.open_idx
        self.diff[idx], self.used[idx] = diff, self.n
        self.lower[idx], self.upper[idx] = np.maximum(lower, -1.0), np.minimum(upper, 1.0)
        done = codes != UNDECIDED
        self.verdict[idx[done]] = codes[done]
        self.look[idx[done]] = self.looks
        if done.any():
            keep = ~done
            ps.keep(keep)
            self.open_idx, self.open_a, self.open_b = idx[keep], self.open_a[keep], self.open_b[keep]
            still = np.zeros(len(self.names), dtype=bool)
            still[self.open_a] = True
            still[self.open_b] = True
            self.model_open &= still

    # -- result -----------------------------------------------------------------------------------------
    def guarantee(self) -> str:
        p = len(self.pa)
        how = (f"Bonferroni over the {p} pairs (each at alpha/{p})" if self.correction == "bonferroni"
               else "NO multiplicity correction (demonstration only: no family-wise control)")
        return f"{GUARANTEE}; family-wise over every ordering statement by {how}"

    def pair_table(self) -> BankPairTable:
        return BankPairTable(self.names, self.pa, self.pb, self.verdict.astype(np.int64), self.look, self.used,
                             self.diff, self.lower, self.upper, self.n_total, 1.0 - self.alpha, self.margin,
                             self.guarantee())

    def result(self):
        return assemble_ranking(self.pair_table(), self.model_mean, self.model_used, alpha=self.alpha,
                                correction=self.correction)

    def model_intervals(self) -> dict[str, tuple[float, float, float, int]]:
        """Per model: (mean, lower, upper, items) — simultaneous CSs at alpha / M for the bank means."""
        return {n: (float(self.model_mean[k]), float(self.model_lower[k]), float(self.model_upper[k]),
                    int(self.model_used[k])) for k, n in enumerate(self.names)}

    # -- state ------------------------------------------------------------------------------------------
    ARRAYS = ("u", "open_a", "open_b", "open_idx", "pa", "pb", "verdict", "look", "used", "diff", "lower", "upper",
              "model_open", "model_used", "model_mean", "model_lower", "model_upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "bank-ranking", "names": list(self.names), "alpha": self.alpha, "margin": self.margin,
                "correction": self.correction, "c": self.c, "n": self.n, "looks": self.looks,
                "pairs": self.pairs.state(), "models": self.models.state(),
                **{k: getattr(self, k).copy() for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "BankRanking":
        obj = cls(state["names"], alpha=float(state["alpha"]), margin=float(state["margin"]),
                  correction=str(state["correction"]))
        obj.c, obj.n, obj.looks = float(state["c"]), int(state["n"]), int(state["looks"])
        obj.pairs = WorStreams.from_state(state["pairs"])
        obj.models = WorStreams.from_state(state["models"])
        for k in cls.ARRAYS:
            setattr(obj, k, np.asarray(state[k]).copy())
        return obj


def bank_rank(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], *, alpha: float = 0.05,
              margin: float = 0.0, weights: np.ndarray | None = None, correction: str = "bonferroni"):
    """Replay a bank-target ranking over ``scores`` (``(M, N)``, columns in the shared order, the whole bank)
    with looks after ``look_n[k]`` items; ``weights`` per column (default 1/N)."""
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


# ------------------------------------------------------------------------------------------- selection
@dataclass(frozen=True)
class BestArmResult:
    """Top-K identification within epsilon on the bank target (see :class:`BankSelection`)."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[Any, ...]  # ModelStatus
    n_total: int
    top: int
    epsilon: float
    threshold: float
    alpha: float
    guarantee: str
    done: bool

    @property
    def fraction_used(self) -> float:
        return float(sum(m.n_scored for m in self.models)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "selected": list(self.selected), "discarded": list(self.discarded),
            "models": [dict(vars(m)) for m in self.models], "n_total": self.n_total,
            "fraction_used": self.fraction_used, "top": self.top, "epsilon": self.epsilon,
            "threshold": self.threshold, "halfwidth": self.epsilon, "mode": "best", "alpha": self.alpha,
            "guarantee": self.guarantee, "target": "bank", "done": self.done})


class BankSelection:
    """Best-arm (top-K) identification within epsilon, bank target, on the shared uniform order.

    Each model has a without-replacement CS for its bank mean at level alpha / M (simultaneous over models
    and looks). At each look, with A the models not yet dropped:

    * a model with ``upper < threshold`` is dropped ("below");
    * a model with at least K models of A whose lower bound exceeds its upper bound is surely outside the
      top K and is dropped ("not-best");
    * stop when the K models of A with the largest means, S, satisfy ``min_{i in S} lower_i >=
      max_{j in A \\ S} upper_j - epsilon`` (LUCB's rule, Kalyanakrishnan et al. 2012): on the event that
      every CS covers, each selected model's bank mean is within epsilon of every unselected one's, i.e.
      the selection is an epsilon-top-K of the bank, with probability >= 1 - alpha. Models of S keep being
      scored until then; at exhaustion the exact means decide.
    """

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, top: int = 1, epsilon: float = 0.0,
                 threshold: float = 0.0) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 1:
            raise InputError("selection needs at least one model")
        self.alpha = check_alpha(alpha)
        self.top = check_positive_int(top, "top")
        if self.top > len(self.names):
            raise InputError(f"top must be at most the number of models ({len(self.names)}), got {top!r}")
        self.epsilon = check_in_range(epsilon, "epsilon", 0.0, 1.0)
        self.threshold = check_in_range(threshold, "threshold", 0.0, 1.0)

    def start(self, weights: np.ndarray) -> "BankSelection":
        self.u, self.c = item_scale(weights)
        m = len(self.names)
        self.streams = WorStreams(m, self.u.size, math.log(2.0 * m / self.alpha))
        self.status = np.array(["running"] * m, dtype=object)
        self.look_of = np.zeros(m, dtype=np.int32)
        self.used = np.zeros(m, dtype=np.int32)
        self.mean = np.full(m, np.nan)
        self.lower = np.zeros(m)
        self.upper = np.ones(m)
        self.n = 0
        self.looks = 0
        self.finished = False
        return self

    @property
    def n_total(self) -> int:
        return int(self.u.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in range(len(self.names)) if self.status[k] == "running"]

    def update(self, items: Any, scores: Any) -> "BankSelection":
        items, x = look_arrays(self.names, items, scores)
        if items.size == 0 or self.finished:
            return self
        live = np.flatnonzero(self.status == "running")
        if np.isnan(x[live]).any():
            raise InputError("every model still in play needs a score for every item of the look")
        self.n += items.size
        self.looks += 1
        absorb_rows(self.streams, live, x[live] * self.u[items] / self.c, self.n - items.size)
        self.used[live] = self.n
        self.mean[live] = self.c * self.streams.total[live] / self.n
        self.lower[live] = self.c * self.streams.lower[live]
        self.upper[live] = np.minimum(1.0, self.c * self.streams.upper[live])
        self._decide(live)
        return self

    def _decide(self, live: np.ndarray) -> None:
        k = self.top
        alive = np.flatnonzero(self.status != "below")
        alive = alive[self.status[alive] != "not-best"]
        for j in live:
            if self.upper[j] < self.threshold:
                self.status[j], self.look_of[j] = "below", self.looks
        alive = alive[self.status[alive] != "below"]
        if len(alive) > k:  # surely outside the top K: K models certainly better
            kth_low = np.sort(self.lower[alive])[::-1][k - 1]
            for j in alive:
                if self.status[j] == "running" and self.upper[j] < kth_low:
                    self.status[j], self.look_of[j] = "not-best", self.looks
            alive = alive[self.status[alive] != "not-best"]
        exact = self.n == self.n_total
        if len(alive) <= k:
            chosen, rest = alive, alive[:0]
        else:
            by_mean = alive[np.argsort(-self.mean[alive], kind="stable")]
            chosen, rest = by_mean[:k], by_mean[k:]
        if exact or len(rest) == 0 or self.lower[chosen].min() >= self.upper[rest].max() - self.epsilon:
            for j in chosen:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "selected", self.looks
            for j in rest:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "not-selected", self.looks
            self.finished = True

    def result(self) -> BestArmResult:
        from .selection import ModelStatus

        m = len(self.names)
        keep = [j for j in range(m) if self.status[j] in ("selected", "running")]
        keep.sort(key=lambda j: -self.mean[j])
        models = tuple(ModelStatus(self.names[j], float(self.mean[j]), float(self.lower[j]), float(self.upper[j]),
                                   int(self.used[j]), str(self.status[j]), int(self.look_of[j]) or None)
                       for j in range(m))
        guarantee = (f"bank target, anytime-valid: without-replacement empirical-Bernstein CS per model at level "
                     f"{1 - self.alpha / m:.4g} (Bonferroni over {m} models); the selection is an epsilon-top-{self.top} "
                     f"of the bank means and every drop is correct, jointly with probability >= {1 - self.alpha:g}")
        return BestArmResult(tuple(self.names[j] for j in keep),
                             tuple(self.names[j] for j in range(m) if j not in keep), models, self.n_total, self.top,
                             self.epsilon, self.threshold, self.alpha, guarantee, self.finished)

    ARRAYS = ("u", "status", "look_of", "used", "mean", "lower", "upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "bank-selection", "names": list(self.names), "alpha": self.alpha, "top": self.top,
                "epsilon": self.epsilon, "threshold": self.threshold, "c": self.c, "n": self.n, "looks": self.looks,
                "finished": self.finished, "streams": self.streams.state(),
                **{k: (getattr(self, k).astype(str).tolist() if k == "status" else getattr(self, k).copy())
                   for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "BankSelection":
        obj = cls(state["names"], alpha=float(state["alpha"]), top=int(state["top"]),
                  epsilon=float(state["epsilon"]), threshold=float(state["threshold"]))
        obj.c, obj.n, obj.looks, obj.finished = float(state["c"]), int(state["n"]), int(state["looks"]), \
            bool(state["finished"])
        obj.streams = WorStreams.from_state(state["streams"])
        for k in cls.ARRAYS:
            v = np.asarray(state[k])
            setattr(obj, k, v.astype(object) if k == "status" else v.copy())
        return obj
