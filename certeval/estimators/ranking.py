"""Ranking M models by sequential pairwise comparisons on shared items, with tie groups.

Every pair is compared on the same item order (:mod:`.comparison`).  Family-wise error
over the ``P = M(M-1)/2`` pairs is controlled by **Bonferroni on the spending**: each
pair's boundary spends ``alpha / P``, so all P repeated confidence intervals cover
their differences simultaneously with probability >= 1 - alpha (union bound), and
every verdict drawn from them — ``a>b``, ``b>a`` and ``equivalent`` alike — is correct
simultaneously.  Holm's step-down would reject more but controls only the directional
verdicts, not the equivalence statements, so it is not used.  (Arviv et al., seed 004
§6.2, apply no multiplicity correction.)

A model stops being sampled once all its pairs are decided.  A model joins the tie group
of the best model above it unless that pair was separated (a directional verdict);
pairs equivalent within the margin or undecided when the bank ran out are not separated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ._validation import InputError, check_alpha
from .comparison import A_GT_B, B_GT_A, RULES, VERDICTS, Comparison, ComparisonDesign, run_sequential_pairs
from .results import _clean


@dataclass(frozen=True)
class Ranking:
    """Ordered models, tie groups (models not separable at the margin) and each pair's comparison."""

    models: tuple[str, ...]  # best first
    tie_groups: tuple[tuple[str, ...], ...]
    means: tuple[float, ...]  # mean score of each model in ``models`` order, over the items it was scored on
    items_used: tuple[int, ...]  # items scored per model (``models`` order)
    n_total: int
    comparisons: tuple[Comparison, ...]
    alpha: float
    correction: str
    guarantee: str

    def rank_of(self, model: str) -> int:
        """1-based tie-group rank of a model."""
        for i, group in enumerate(self.tie_groups):
            if model in group:
                return i + 1
        raise InputError(f"model {model!r} is not in the ranking")

    @property
    def fraction_used(self) -> float:
        return float(np.sum(self.items_used)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return _clean({
            "models": list(self.models),
            "tie_groups": [list(g) for g in self.tie_groups],
            "means": list(self.means),
            "items_used": list(self.items_used),
            "n_total": self.n_total,
            "fraction_used": self.fraction_used,
            "alpha": self.alpha,
            "correction": self.correction,
            "guarantee": self.guarantee,
            "comparisons": [c.to_dict() for c in self.comparisons],
        })


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


def rank_models(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], *, alpha: float = 0.05,
                margin: float = 0.0, design: ComparisonDesign | None = None, correction: str = "bonferroni",
                subsets: np.ndarray | None = None, n_subsets: int | None = None) -> Ranking:
    """Sequentially rank models from ``scores`` (``(M, n)``, columns in the shared scoring order).

    Looks after ``look_n[k]`` items (the last look may be ``< n`` for a budget).  ``design``
    sets statistic / spending / guarantee; its ``alpha`` is replaced by ``alpha / P``
    (``correction="bonferroni"``) or kept (``"none"``, for demonstration only: no
    family-wise control).  The bank size is ``n``.
    """
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[0] != len(names):
        raise InputError(f"scores must be (models, items) with one row per name, got {scores.shape} for {len(names)} names")
    if len(names) < 2:
        raise InputError(f"a ranking needs at least two models, got {len(names)}")
    if scores.shape[1] == 0 or np.isnan(scores).all(axis=0).all():
        raise InputError("the models share no scored items")
    if np.isnan(scores).any():
        raise InputError("every model must have a score for every shared item (drop items some model lacks)")
    alpha = check_alpha(alpha)
    if correction not in ("bonferroni", "none"):
        raise InputError(f"correction must be bonferroni or none, got {correction!r}")
    m, n = scores.shape
    ii, jj = pair_indices(m)
    n_pairs = len(ii)
    base = design if design is not None else ComparisonDesign(alpha=alpha, margin=margin)
    pair_alpha = alpha / n_pairs if correction == "bonferroni" else alpha
    pair_design = replace(base, alpha=pair_alpha, goal="difference")
    look_n = [int(x) for x in look_n if 0 < x <= n]
    if not look_n:
        raise InputError("no look: look sizes must lie in [1, number of items]")
    res = run_sequential_pairs(scores[ii], scores[jj], look_n, pair_design, n_total=n, subsets=subsets,
                               n_subsets=n_subsets)
    separated = np.zeros((m, m), dtype=bool)
    directional = np.isin(res["verdict"], (A_GT_B, B_GT_A))
    separated[ii, jj] = directional
    separated[jj, ii] = directional
    # a model is sampled until all its pairs are decided
    used = np.zeros(m, dtype=np.int64)
    np.maximum.at(used, ii, res["used"])
    np.maximum.at(used, jj, res["used"])
    means = np.array([scores[k, : max(used[k], 1)].mean() for k in range(m)])
    groups = tie_groups(list(names), means, separated)
    order = [k for g in groups for k in g]
    guarantee = (pair_design.describe() + f"; family-wise over {n_pairs} pairs by "
                 + ("Bonferroni on the spending (alpha/P per pair)" if correction == "bonferroni" else "NO correction"))
    comparisons = []
    for p in range(n_pairs):
        code = int(res["verdict"][p])
        comparisons.append(Comparison(
            names[ii[p]], names[jj[p]], int(res["used"][p]), n, float(res["diff"][p]),
            float(max(-1.0, res["lower"][p])), float(min(1.0, res["upper"][p])), VERDICTS[code], RULES[code],
            int(res["look"][p]) or None, pair_design.describe(), 1 - pair_alpha, pair_design.statistic,
            pair_design.goal, float(pair_design.margin), exact=bool(res["used"][p] == n)))
    return Ranking(
        models=tuple(names[k] for k in order),
        tie_groups=tuple(tuple(names[k] for k in g) for g in groups),
        means=tuple(float(means[k]) for k in order),
        items_used=tuple(int(used[k]) for k in order),
        n_total=n,
        comparisons=tuple(comparisons),
        alpha=alpha,
        correction=correction,
        guarantee=guarantee,
    )
