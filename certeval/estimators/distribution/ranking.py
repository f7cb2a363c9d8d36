"""Ranking M models by sequential pairwise comparisons on shared items, with tie groups.

Every pair is compared on the same item order (:mod:`.comparison`).  Family-wise error
over the ``P = M(M-1)/2`` pairs is controlled by **Bonferroni on the spending**: each
pair's boundary spends ``alpha / P``, so all P repeated confidence intervals cover
their differences simultaneously with probability >= 1 - alpha (union bound), and
every verdict drawn from them — ``a>b``, ``b>a`` and ``equivalent`` alike — is correct
simultaneously.  Holm's step-down would reject more but controls only the directional
verdicts, not the equivalence statements, so it is not used.  (Arviv et al. 2026
§6.2, apply no multiplicity correction.)

Two exact computations of the same pair statistics: ``path="pairs"`` materialises each pair's
score rows (``P x n``, fine for tens of models); ``path="gram"`` (default once ``P * n`` is
large) uses that a paired difference's sum and sum of squares follow from per-model sums and
the Gram matrix ``X X^T`` of the scored columns, per subset (``sum d^2 = q_a + q_b - 2 G_ab``),
updated look by look: ``O(M^2 n)`` time and ``O(S M^2)`` memory instead of ``O(M^2 n)`` memory,
so all 1,989 models of ``openllm_tiny`` (2M pairs) rank in seconds.  Both give the same
verdicts; floats agree to rounding (tests/test_scale_paths.py).

A model stops being sampled once all its pairs are decided.  A model joins the tie group
of the best model above it unless that pair was separated (a directional verdict);
pairs equivalent within the margin or undecided when the bank ran out are not separated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..results import to_jsonable
from ..validation import check_alpha
from .comparison import A_GT_B, B_GT_A, RULES, UNDECIDED, VERDICTS, Comparison, ComparisonDesign, run_sequential_pairs
from .sequential import boundary_multiplier

PATHS = ("auto", "pairs", "gram")
# above this many pair-cells (P * n) "auto" takes the Gram path: the pairs path would hold 2 * P * n floats
GRAM_MIN_CELLS = 5_000_000


@dataclass(frozen=True, eq=False)
class PairOutcomes:
    """Every pair's outcome as arrays (pair ``p`` compares ``names[a[p]]`` with ``names[b[p]]``), what a
    :class:`Ranking` reads: the distribution target's :class:`PairTable` and the bank target's
    :class:`~certeval.estimators.bank.ranking.BankPairTable` add how the pairs were tested.

    Two million :class:`Comparison` objects would cost seconds and gigabytes per look, so a
    ranking keeps arrays and builds comparisons only when asked.
    """

    names: tuple[str, ...]
    a: np.ndarray
    b: np.ndarray
    verdict: np.ndarray  # codes into VERDICTS
    look: np.ndarray  # 1-based look of the decision, 0 = undecided
    used: np.ndarray
    diff: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    n_total: int

    def __len__(self) -> int:
        return len(self.a)

    @property
    def decided(self) -> np.ndarray:
        return self.verdict != UNDECIDED

    @property
    def n_pairs_total(self) -> int:
        """Pairs on the board (a table may hold only some of them)."""
        return len(self)

    @property
    def n_decided_total(self) -> int:
        return int(self.decided.sum())

    def columns(self) -> dict[str, Any]:
        """Column arrays (JSON/Parquet-ready): model names, verdict, rule, look, items, diff and bounds."""
        names = np.asarray(self.names, dtype=object)
        return {"model_a": names[self.a], "model_b": names[self.b],
                "verdict": np.asarray(VERDICTS, dtype=object)[self.verdict],
                "rule": np.asarray(RULES, dtype=object)[self.verdict], "look": self.look.astype(np.int64),
                "n_items": self.used.astype(np.int64), "diff": self.diff, "lower": np.maximum(-1.0, self.lower),
                "upper": np.minimum(1.0, self.upper)}


@dataclass(frozen=True, eq=False)
class PairTable(PairOutcomes):
    """:class:`PairOutcomes` of group-sequential or anytime pair tests under one :class:`ComparisonDesign`."""

    design: ComparisonDesign

    def comparison(self, p: int) -> Comparison:
        code, d = int(self.verdict[p]), self.design
        return Comparison(
            self.names[self.a[p]], self.names[self.b[p]], int(self.used[p]), self.n_total, float(self.diff[p]),
            float(max(-1.0, self.lower[p])), float(min(1.0, self.upper[p])), VERDICTS[code], RULES[code],
            int(self.look[p]) or None, d.describe(), 1 - d.alpha, d.statistic, d.goal, float(d.margin),
            exact=bool(self.used[p] == self.n_total))


def rank_numbers(tie_groups) -> list[int]:
    """The rank of each tie group, best first: ties share a rank and the next group skips as many places
    (1, 2, 2, 4). The one numbering of every screen: the progress lines, a model's decision, the CLI summary,
    report.md and ranking.png."""
    ranks, rank = [], 1
    for group in tie_groups:
        ranks.append(rank)
        rank += len(group)
    return ranks


@dataclass(frozen=True)
class Ranking:
    """Ordered models, tie groups (models not separable at the margin) and each pair's comparison."""

    models: tuple[str, ...]  # best first
    tie_groups: tuple[tuple[str, ...], ...]
    means: tuple[float, ...]  # mean score of each model in ``models`` order, over the items it was scored on
    items_used: tuple[int, ...]  # items scored per model (``models`` order)
    n_total: int
    pairs: PairOutcomes = field(compare=False, repr=False)
    alpha: float = 0.05
    correction: str = "bonferroni"
    guarantee: str = ""
    epsilon: float | None = None  # ε-statements (listed above = at least the other's mean minus ε); None: strict
    halfwidth: float | None = None  # leaderboard precision: every model's interval within ±halfwidth

    @property
    def statement(self) -> str:
        """Which ordering statements the ranking makes: ``strict`` (verdicts at the margin), ``epsilon``, or
        ``precision`` (every model's mean within ±halfwidth; "a>b" where the intervals do not overlap)."""
        return "epsilon" if self.epsilon is not None else "precision" if self.halfwidth is not None else "strict"

    @cached_property
    def comparisons(self) -> tuple[Comparison, ...]:
        """Each pair's decision and CI (built on first access)."""
        return tuple(self.pairs.comparison(p) for p in range(len(self.pairs)))

    @cached_property
    def _rank(self) -> dict[str, int]:
        return {m: rank for group, rank in zip(self.tie_groups, rank_numbers(self.tie_groups)) for m in group}

    def rank_of(self, model: str) -> int:
        """A model's rank (:func:`rank_numbers`: ties share a rank, the next group skips as many places)."""
        if model not in self._rank:
            raise InputError(f"model {model!r} is not in the ranking")
        return self._rank[model]

    def undecided_models(self) -> list[str]:
        """Models with at least one undecided pair (still to be sampled), in input order."""
        open_ = ~self.pairs.decided
        idx = np.unique(np.concatenate([self.pairs.a[open_], self.pairs.b[open_]]))
        return [self.pairs.names[k] for k in idx]

    @property
    def fraction_used(self) -> float:
        return float(np.sum(self.items_used)) / (len(self.models) * self.n_total)

    def to_dict(self, comparisons: bool = True) -> dict[str, Any]:
        """JSON-able summary; ``comparisons=False`` leaves out the per-pair list (millions for large M)."""
        out = to_jsonable({
            "models": list(self.models),
            "tie_groups": [list(g) for g in self.tie_groups],
            "means": list(self.means),
            "items_used": list(self.items_used),
            "n_total": self.n_total,
            "fraction_used": self.fraction_used,
            "alpha": self.alpha,
            "correction": self.correction,
            "guarantee": self.guarantee,
            "statement": self.statement,
            "epsilon": self.epsilon,
            "halfwidth": self.halfwidth,
            # a neighbour ranking's table may hold only the pairs it opened: its totals count every pair
            "n_pairs": self.pairs.n_pairs_total,
            "n_pairs_decided": self.pairs.n_decided_total,
        })
        if comparisons:
            out["comparisons"] = [c.to_dict() for c in self.comparisons]
        return out


def pair_indices(m: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(m, k=1)
    return i, j


def tie_groups(names: Sequence[str], means: np.ndarray, separated: np.ndarray) -> list[list[int]]:
    """Tie groups (indices, best first): runs of models not separated from their group's leader.

    Models are sorted by mean; the best opens a group; each next model joins the current
    group unless its pair with the group's leader got a directional verdict, in which case
    it opens a new group.  ``separated[i, j]`` is True for a directional verdict.  (The
    transitive closure of "not separated" would chain a whole close-packed leaderboard
    into one group.)
    """
    order = sorted(range(len(names)), key=lambda k: (-means[k], names[k]))
    groups: list[list[int]] = []
    for k in order:
        if groups and not separated[groups[-1][0], k]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def ordering_means(scores: np.ndarray, used: np.ndarray, subsets: np.ndarray | None = None,
                   n_subsets: int | None = None) -> np.ndarray:
    """Each model's estimate over its first ``used[k]`` shared items, in the estimand the verdicts test:
    the mean of sub-dataset means (Arviv et al. 2026, eq. 1) when the bank has sub-datasets (over the sub-datasets
    scored so far), else the plain mean. Ordering by another estimand than the verdicts' could rank a model
    first that a verdict certified worse."""
    m = scores.shape[0]
    out = np.empty(m)
    codes = None if subsets is None else np.asarray(subsets, dtype=np.int64)
    for k in range(m):
        n_k = max(int(used[k]), 1)
        row = scores[k, :n_k]
        if codes is None:
            out[k] = row.mean()
            continue
        c = codes[:n_k]
        count = int(n_subsets if n_subsets is not None else codes.max() + 1)
        sums = np.bincount(c, weights=row, minlength=count)
        sizes = np.bincount(c, minlength=count)
        seen = sizes > 0
        out[k] = float(np.mean(sums[seen] / sizes[seen]))
    return out


@dataclass(frozen=True)
class RankingOptions:
    """How the family of ``P = M(M-1)/2`` pairs is tested: the family-wise level ``alpha``, the ``correction``
    (``"bonferroni"``: each pair spends ``alpha / P``; ``"none"``: the pair keeps ``alpha``, for demonstration only,
    no family-wise control) and the pair ``design`` (statistic / spending / guarantee; default
    ``ComparisonDesign(alpha, margin)``), whose ``alpha`` is replaced by the pair's."""

    alpha: float = 0.05
    margin: float = 0.0
    design: ComparisonDesign | None = None
    correction: str = "bonferroni"

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_alpha(self.alpha))
        if self.correction not in ("bonferroni", "none"):
            raise InputError(f"correction must be bonferroni or none, got {self.correction!r}")

    def pair_design(self, n_pairs: int) -> ComparisonDesign:
        """The design each of ``n_pairs`` pairs is tested with."""
        base = self.design if self.design is not None else ComparisonDesign(alpha=self.alpha, margin=self.margin)
        pair_alpha = self.alpha / n_pairs if self.correction == "bonferroni" else self.alpha
        return replace(base, alpha=pair_alpha, goal="difference")


def rank_models(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], *,
                options: RankingOptions | None = None, subsets: np.ndarray | None = None,
                n_subsets: int | None = None, path: str = "auto") -> Ranking:
    """Sequentially rank models from ``scores`` (``(M, n)``, columns in the shared scoring order).

    Looks after ``look_n[k]`` items (the last look may be ``< n`` for a budget); ``options`` (default
    :class:`RankingOptions`) sets the level, the correction and the pair design.  The bank size is ``n``.
    ``path``: ``"pairs"`` (per-pair score rows), ``"gram"`` (per-model sums and Gram matrices; group-sequential
    guarantee only) or ``"auto"``.
    """
    options = options if options is not None else RankingOptions()
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[0] != len(names):
        raise InputError(f"scores must be (models, items) with one row per name, got {scores.shape} for {len(names)} names")
    if len(names) < 2:
        raise InputError(f"a ranking needs at least two models, got {len(names)}")
    if scores.shape[1] == 0 or np.isnan(scores).all(axis=0).all():
        raise InputError("the models share no scored items")
    if np.isnan(scores).any():
        raise InputError("every model must have a score for every shared item (drop items some model lacks)")
    if path not in PATHS:
        raise InputError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    m, n = scores.shape
    ii, jj = pair_indices(m)
    n_pairs = len(ii)
    pair_design = options.pair_design(n_pairs)
    look_n = [int(x) for x in look_n if 0 < x <= n]
    if not look_n:
        raise InputError("no look: look sizes must lie in [1, number of items]")
    if path == "gram" and pair_design.guarantee != "group-sequential":
        raise InputError("path='gram' computes the group-sequential statistic; the anytime confidence sequence "
                         "needs path='pairs'")
    if path == "auto":
        big = n_pairs * n >= GRAM_MIN_CELLS
        path = "gram" if big and pair_design.guarantee == "group-sequential" else "pairs"
    if path == "gram":
        res = gram_sequential_pairs(scores, ii, jj, look_n, pair_design, n_total=n, subsets=subsets,
                                    n_subsets=n_subsets)
    else:
        res = run_sequential_pairs(scores[ii], scores[jj], look_n, pair_design, n_total=n, subsets=subsets,
                                   n_subsets=n_subsets)
    used = model_used(m, ii, jj, res["used"])
    means = ordering_means(scores, used, subsets, n_subsets)
    return ranking_from_pairs(pair_table(names, ii, jj, res, n, pair_design), means, used, options)


def model_used(m: int, ii: np.ndarray, jj: np.ndarray, pair_used: np.ndarray) -> np.ndarray:
    """Items each model was sampled for: a model is sampled until all its pairs are decided."""
    used = np.zeros(m, dtype=np.int64)
    np.maximum.at(used, ii, pair_used)
    np.maximum.at(used, jj, pair_used)
    return used


def pair_table(names: Sequence[str], ii: np.ndarray, jj: np.ndarray, res: dict[str, np.ndarray], n: int,
               pair_design: ComparisonDesign) -> PairTable:
    """The pairs ``(ii[p], jj[p])`` of ``names`` with their outcomes ``res`` (verdict, look, used, diff, lower,
    upper per pair)."""
    return PairTable(tuple(str(x) for x in names), ii, jj, res["verdict"], res["look"], res["used"], res["diff"],
                     res["lower"], res["upper"], n, pair_design)


def ranking_from_pairs(table: PairTable, means: np.ndarray, used: np.ndarray, options: RankingOptions) -> Ranking:
    """The :class:`Ranking` of the pair outcomes in ``table``; ``means`` and ``used`` per model."""
    names, ii, jj, n, pair_design = table.names, table.a, table.b, table.n_total, table.design
    m = len(names)
    n_pairs = len(ii)
    separated = np.zeros((m, m), dtype=bool)
    directional = np.isin(table.verdict, (A_GT_B, B_GT_A))
    separated[ii, jj] = directional
    separated[jj, ii] = directional
    groups = tie_groups(list(names), means, separated)
    order = [k for g in groups for k in g]
    bonferroni = options.correction == "bonferroni"
    guarantee = (pair_design.describe() + f"; family-wise over {n_pairs} pairs by "
                 + ("Bonferroni on the spending (alpha/P per pair)" if bonferroni else "NO correction"))
    return Ranking(
        models=tuple(names[k] for k in order),
        tie_groups=tuple(tuple(names[k] for k in g) for g in groups),
        means=tuple(float(means[k]) for k in order),
        items_used=tuple(int(used[k]) for k in order),
        n_total=n,
        pairs=table,
        alpha=options.alpha,
        correction=options.correction,
        guarantee=guarantee,
    )


def gram_sequential_pairs(scores: np.ndarray, ii: np.ndarray, jj: np.ndarray, look_n: list[int],
                          design: ComparisonDesign, n_total: int, subsets: np.ndarray | None = None,
                          n_subsets: int | None = None) -> dict[str, np.ndarray]:
    """:func:`~.comparison.run_sequential_pairs` for pairs ``(ii[p], jj[p])`` of the rows of ``scores``, from
    sufficient statistics (:class:`GramPairs`, look by look)."""
    x_all = np.asarray(scores, dtype=float)
    pairs = GramPairs(x_all.shape[0], ii, jj, design, n_total, subsets, n_subsets)
    prev = 0
    for n_k in look_n:
        if pairs.open_idx.size == 0:
            break
        pairs.absorb(x_all[:, prev:n_k])
        prev = n_k
    return pairs.result()


class GramPairs:
    """Group-sequential pair tests from sufficient statistics, one look at a time.

    Per subset ``s`` and model, running sums ``u`` and sums of squares ``q`` of the scores, and the
    Gram matrix ``G = X X^T`` of the scored columns, are updated with each look's new columns.  A
    pair's differences then have ``sum d = u_a - u_b`` and ``sum d^2 = q_a + q_b - 2 G_ab``, which
    give the per-subset mean and ddof-1 variance of :func:`.sequential.mean_of_means` (same floor
    ``1/n_s``).  Unpaired: each model's own mean and variance from ``u`` and ``q``.  Undecided
    pairs are evaluated at every look; decided pairs keep their stop.  A look costs O(S M^2 b) for
    ``b`` new columns, whatever the look number.  Each model's per-subset sums over the columns it was
    sampled for (while it had an undecided pair) give its ordering estimate (:meth:`ordering_means`).
    """

    def __init__(self, m: int, ii: np.ndarray, jj: np.ndarray, design: ComparisonDesign, n_total: int,
                 subsets: np.ndarray | None = None, n_subsets: int | None = None) -> None:
        if design.guarantee != "group-sequential":
            raise InputError("the Gram path computes the group-sequential statistic only")
        self.m, self.ii, self.jj, self.design, self.n_total = int(m), ii, jj, design, int(n_total)
        self.plain = subsets is None
        self.codes = None if self.plain else np.asarray(subsets, dtype=np.int64)
        self.n_sub = 1 if self.plain else int(n_subsets if n_subsets is not None else self.codes.max() + 1)
        self.paired = design.statistic == "paired"
        pairs = len(ii)
        self.verdict = np.full(pairs, UNDECIDED)
        self.look = np.zeros(pairs, dtype=np.int64)
        self.used = np.zeros(pairs, dtype=np.int64)
        self.out = {k: np.full(pairs, np.nan) for k in ("diff", "lower", "upper")}
        self.counts = np.zeros(self.n_sub, dtype=np.int64)
        self.sums = np.zeros((self.n_sub, self.m))
        self.squares = np.zeros((self.n_sub, self.m))
        self.gram = np.zeros((self.n_sub, self.m, self.m)) if self.paired else None
        self.model_sums = np.zeros((self.n_sub, self.m))  # frozen once a model has no undecided pair
        self.model_counts = np.zeros((self.n_sub, self.m))
        self.open_idx = np.arange(pairs)
        self.looks: list[int] = []
        self.n = 0

    def absorb(self, block: np.ndarray) -> None:
        """The next ``(M, b)`` columns of the shared order; then every undecided pair is tested at this look."""
        block = np.asarray(block, dtype=float)
        n_k = self.n + block.shape[1]
        if block.ndim != 2 or block.shape[0] != self.m or n_k > self.n_total:
            raise InputError(f"a look must be (models={self.m}, items) within the {self.n_total} shared items, "
                             f"got {block.shape} after {self.n}")
        block_codes = np.zeros(block.shape[1], dtype=np.int64) if self.plain else self.codes[self.n:n_k]
        self.n = n_k
        self.looks.append(n_k)
        if self.open_idx.size == 0:
            return
        live = np.zeros(self.m, dtype=bool)
        live[self.ii[self.open_idx]] = True
        live[self.jj[self.open_idx]] = True
        for s in range(self.n_sub):
            x = block[:, block_codes == s]
            if x.shape[1] == 0:
                continue
            self.counts[s] += x.shape[1]
            row_sums = x.sum(axis=1)
            self.sums[s] += row_sums
            self.squares[s] += (x * x).sum(axis=1)
            if self.paired:
                self.gram[s] += x @ x.T
            self.model_sums[s, live] += row_sums[live]
            self.model_counts[s, live] += x.shape[1]
        open_idx = self.open_idx
        a, b = self.ii[open_idx], self.jj[open_idx]
        diff, var = _pair_mean_var(self.sums, self.squares, self.gram, self.counts, a, b, self.plain)
        d = self.design
        c = boundary_multiplier(d.spending, d.alpha, list(self.looks), self.n_total, d.look_size, d.sides)
        half = c * np.sqrt(var)
        lower, upper = diff - half, diff + half
        v = d.verdict_codes(lower, upper)
        self.out["diff"][open_idx], self.out["lower"][open_idx], self.out["upper"][open_idx] = diff, lower, upper
        self.used[open_idx] = n_k
        decided = v != UNDECIDED
        self.verdict[open_idx[decided]] = v[decided]
        self.look[open_idx[decided]] = len(self.looks)
        self.open_idx = open_idx[~decided]

    def result(self) -> dict[str, np.ndarray]:
        return {"verdict": self.verdict.copy(), "look": self.look.copy(), "used": self.used.copy(),
                **{k: v.copy() for k, v in self.out.items()}}

    def ordering_means(self) -> np.ndarray:
        """:func:`ordering_means` from the running sums: each model's (mean-of-means) estimate over the columns
        it was sampled for."""
        seen = self.model_counts > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.where(seen, self.model_sums / np.where(seen, self.model_counts, 1.0), 0.0)
        k = np.maximum(seen.sum(axis=0), 1)
        return per.sum(axis=0) / k


class SequentialRanking:
    """:func:`rank_models` (distribution target, group-sequential) one look at a time: the pairs' Gram
    statistics are updated with the new columns only (:class:`GramPairs`), so a look of a paired run costs
    the same at look 20 as at look 1 instead of replaying every look from the first.

    ``update(block)`` takes the next ``(M, b)`` columns of the shared order (models that stopped: any value,
    they are not read); ``result()`` is the :class:`Ranking` so far.
    """

    def __init__(self, names: Sequence[str], *, n_total: int, options: RankingOptions | None = None,
                 subsets: np.ndarray | None = None, n_subsets: int | None = None) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 2:
            raise InputError(f"a ranking needs at least two models, got {len(self.names)}")
        self.options = options if options is not None else RankingOptions()
        self.ii, self.jj = pair_indices(len(self.names))
        self.pair_design = self.options.pair_design(len(self.ii))
        self.n_total = int(n_total)
        self.pairs = GramPairs(len(self.names), self.ii, self.jj, self.pair_design, self.n_total, subsets, n_subsets)

    def update(self, block: np.ndarray) -> Ranking:
        self.pairs.absorb(np.where(np.isnan(block), 0.0, block))  # rows of models that left: never read
        return self.result()

    def result(self) -> Ranking:
        if not self.pairs.looks:
            raise InputError("a ranking needs at least one look")
        res = self.pairs.result()
        used = model_used(len(self.names), self.ii, self.jj, res["used"])
        table = pair_table(self.names, self.ii, self.jj, res, self.n_total, self.pair_design)
        return ranking_from_pairs(table, self.pairs.ordering_means(), used, self.options)


def _pair_mean_var(sums: np.ndarray, squares: np.ndarray, gram: np.ndarray | None, counts: np.ndarray,
                   a: np.ndarray, b: np.ndarray, plain: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mean-of-means difference and its variance for pairs ``(a, b)`` (Arviv et al. 2026 eq. 1; as ``mean_of_means``)."""
    n_sub = len(counts)
    if plain and counts[0] < 2:  # as mean_of_means: the mean is defined from one item, the variance is not
        n0 = counts[0]
        diff = (sums[0, a] - sums[0, b]) / n0 if n0 else np.full(len(a), np.nan)
        return diff, np.full(len(a), np.nan)
    if (counts < 2).any():
        nan = np.full(len(a), np.nan)
        return nan, nan
    diff = np.zeros(len(a))
    var = np.zeros(len(a))
    for s in range(n_sub):
        n_s = float(counts[s])
        if gram is not None:
            sd = sums[s, a] - sums[s, b]
            sdd = squares[s, a] + squares[s, b] - 2.0 * gram[s][a, b]
            diff += sd / n_s
            var += _floored_var(sd, sdd, n_s) / n_s
        else:
            for sign, idx in ((1.0, a), (-1.0, b)):
                su = sums[s, idx]
                diff += sign * su / n_s
                var += _floored_var(su, squares[s, idx], n_s) / n_s
    return diff / n_sub, var / n_sub**2


def _floored_var(total: np.ndarray, total_sq: np.ndarray, n: float) -> np.ndarray:
    """ddof-1 sample variance from sums, floored at ``1/n`` (as ``mean_of_means(var_floor=True)``)."""
    var = np.maximum(total_sq - total * total / n, 0.0) / (n - 1.0)
    return np.maximum(var, 1.0 / n)
