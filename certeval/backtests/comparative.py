"""Comparative backtests: replay recorded scores for pairs, rankings and selections.

``certeval backtest compare | rank | select`` lands here (:func:`certeval.backtests.commands.request_backtest`
builds the :class:`ComparativeBacktest` from the live command's plan). Every rep is one paired run of the
live pipeline's engine (:class:`certeval.engine.PairedRounds`, the same group estimators, scores looked up in the
recorded matrix): a ranking or selection of every model, or one run per sampled pair for ``compare``; items are
revealed in looks of ``looks_every``. The reps fan out as ``paired`` cells through the one backtest driver
(:func:`certeval.backtests.ray_fanout.run_cells`), each seeded by what it is (dataset, models, kind, rep). The
decisions are checked against the whole bank:

* an ordering statement is wrong when the exact bank difference contradicts it — "a>b" claims a difference above
  the margin, "b>a" below minus the margin, "equivalent" one inside it (one rule for both targets);
* compare also reports agreement with the fixed-sample z-test on the whole bank (distribution target) or the
  exact bank verdict (bank target), and the coverage of the bank difference;
* select: an error is discarding a model whose bank mean is >= the threshold, or (bank target) selecting one
  more than epsilon below the K-th best.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import (
    A_GT_B,
    B_GT_A,
    EQUIVALENT,
    VERDICTS,
    pair_verdicts,
)
from certeval.estimators.groups import GroupRequest
from certeval.estimators.protocol import BankSpec
from certeval.inputs.banks import bank_from_scores, load_scores, read_table, score_matrix

from .cells import PAIRED, Cell, DatasetArrays

# a rep's rows: their own module (the driver calls them through backtest.kinds); the names stay importable here
from .paired_rows import _ROW_ONLY, _statement_errors, history_count


def load_matrix(scores: str, items: str | None = None,
                models: Sequence[str] | None = None) -> tuple[np.ndarray, list[str], BankSpec]:
    """The models' score matrix on the items every one of them scored, and the bank spec of those items
    (``models``: every model of the scores file when None)."""
    frame = load_scores(scores)
    table = read_table(items, "items file") if items else None
    bank = bank_from_scores(frame, table)
    models = list(models) if models else sorted(frame["model"].unique())
    if len(set(models)) != len(models):
        raise InputError(f"--model lists a model twice: {models}")
    if len(models) < 2:
        raise InputError(f"a comparative backtest needs at least two models, got {models}")
    matrix = score_matrix(frame, models, bank)
    shared = ~np.isnan(matrix).any(axis=0)
    if not shared.any():
        raise InputError(f"the models {', '.join(models[:4])}{'...' if len(models) > 4 else ''} share no scored items")
    matrix = matrix[:, shared]
    subsets = None
    if bank.subsets is not None and len(bank.subset_names) > 1:
        _, subsets = np.unique(np.asarray(bank.subsets)[shared], return_inverse=True)
    return matrix, models, BankSpec(n_items=matrix.shape[1], subsets=subsets)


def _z_test_verdicts(a: np.ndarray, b: np.ndarray, alpha: float, statistic: str, spec: BankSpec) -> np.ndarray:
    """The fixed-sample z-test's verdict per pair on every shared item (the distribution target's reference)."""
    from certeval.estimators.distribution.sequential import mean_of_means

    subsets = None if spec.subsets is None else spec.subset_codes()
    n_subsets = None if subsets is None else spec.n_subsets
    if statistic == "paired":
        diff, var = mean_of_means(a - b, subsets, n_subsets)
    else:
        ma, va = mean_of_means(a, subsets, n_subsets)
        mb, vb = mean_of_means(b, subsets, n_subsets)
        diff, var = ma - mb, va + vb
    z = special.ndtri(1 - alpha / 2)
    se = np.sqrt(var)
    verdict = np.where(diff - z * se > 0, A_GT_B, np.where(diff + z * se < 0, B_GT_A, 0))
    return verdict


@dataclass(frozen=True)
class ComparativeBacktest:
    """What every rep replays: the recorded matrix (models x shared items), the bank spec of those items, the
    group request (kind, target, level, margin, threshold, epsilon, top, design), the reps and the looks.

    Reps fan out through the one backtest driver (:func:`certeval.backtests.ray_fanout.run_cells`) as ``paired``
    cells: rep ``r`` of a group of models draws its order from ``rep_seed(seed, name, group, kind, r)``, so it
    does not depend on chunking, on Ray (``use_ray``) or on which other pairs run."""

    matrix: np.ndarray
    models: tuple[str, ...]
    spec: BankSpec
    request: GroupRequest
    reps: int = 10
    seed: int = 0
    looks_every: int = 100
    max_items: int | None = None
    n_pairs: int = 200  # compare: pairs sampled (each run on its own, at the request's level)
    name: str = "scores"  # the dataset's name in every rep's seed (the CLI's, as in single-model backtests)
    use_ray: bool = False
    history_fraction: float | None = None  # rank/select: each rep's random share of the models that is history
    live_order: bool = False  # rep r draws its order as the live run with --seed (seed + r) (backtest COMMAND)

    @property
    def run_models(self) -> int:
        """Models each rep runs (all of them, or those left after the history share)."""
        m = len(self.models)
        return m if self.history_fraction is None else m - history_count(m, self.history_fraction)

    def history_summary(self) -> dict[str, Any]:
        """What the summary says about the history share (empty without one)."""
        if self.history_fraction is None:
            return {}
        m = len(self.models)
        return {"history": {"fraction": self.history_fraction, "history_models": m - self.run_models,
                            "run_models": self.run_models,
                            "rule": "each rep splits the models at random: the history share fits one factor model "
                                    "(the prior of every run model); the rest are run and checked"}}

    @property
    def exact(self) -> np.ndarray:
        """Each model's exact bank mean (the estimand's weights)."""
        return self.matrix @ self.spec.weights()

    def data(self) -> DatasetArrays:
        return DatasetArrays(self.name, self.spec, tuple(self.models), self.matrix)

    def cell(self, rows: Sequence[int] | None = None) -> Cell:
        """The ``paired`` cell of ``reps`` runs of the models ``rows`` (every model when None)."""
        kind = self.request.kind
        return Cell(self.name, kind, kind, self.reps, self.looks_every, max_items=self.max_items, kind=PAIRED,
                    rows=None if rows is None else tuple(int(k) for k in rows), request=self.request,
                    history_fraction=self.history_fraction, live_order=self.live_order)

    def fan_out(self, cells: Sequence[Cell]) -> list[dict[str, Any]]:
        """Every rep of ``cells`` through the one driver; rows in (cell, rep) order."""
        from .ray_fanout import FanOut, run_cells

        return run_cells({self.name: self.data()}, cells, self.seed, fan_out=FanOut(use_ray=self.use_ray))


def _entries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in _ROW_ONLY} for row in rows]


def compare_backtest(bt: ComparativeBacktest) -> dict[str, Any]:
    """Each sampled pair run on its own (level alpha per pair), ``reps`` orders each: one paired cell a pair."""
    m, n = bt.matrix.shape
    ii, jj = np.triu_indices(m, k=1)
    if len(ii) > bt.n_pairs:
        # which pairs is not a rep's randomness: drawn once from the root seed
        pick = np.random.default_rng(bt.seed).choice(len(ii), size=bt.n_pairs, replace=False)
        ii, jj = ii[pick], jj[pick]
    exact = bt.exact
    true_diff = exact[ii] - exact[jj]
    code = {v: k for k, v in enumerate(VERDICTS)}
    rows = bt.fan_out([bt.cell((i, j)) for i, j in zip(ii, jj)])  # pair-major, rep-minor
    shape = (len(ii), bt.reps)
    verdicts = np.array([code[r["verdict"]] for r in rows], dtype=np.int64).reshape(shape).T
    used = np.array([r["n_items"] for r in rows], dtype=float).reshape(shape).T
    covered = np.array([r["covered"] for r in rows], dtype=bool).reshape(shape).T
    guarantee = rows[-1]["guarantee"] if rows else ""
    request = bt.request
    if request.target == "bank":
        truth = pair_verdicts(true_diff, None, None, request.margin, True)
    else:
        statistic = request.design.statistic if request.design is not None else "paired"
        truth = _z_test_verdicts(bt.matrix[ii], bt.matrix[jj], request.alpha, statistic, bt.spec)
    wrong = _statement_errors(verdicts, true_diff, request.margin)
    directional = np.isin(verdicts, (A_GT_B, B_GT_A))
    pairs = []
    for p in range(len(ii)):
        counts = np.bincount(verdicts[:, p], minlength=len(VERDICTS))
        pairs.append({
            "model_a": bt.models[ii[p]], "model_b": bt.models[jj[p]], "bank_diff": float(true_diff[p]),
            "truth": VERDICTS[int(truth[p])] if truth[p] else "undecided",
            "fraction_used": float(used[:, p].mean() / n), "separated": float(directional[:, p].mean()),
            "verdicts": {VERDICTS[v]: int(k) for v, k in enumerate(counts) if k},
            "agreement": float((verdicts[:, p] == truth[p]).mean()),
            "error_rate": float(wrong[:, p].mean()), "coverage": float(covered[:, p].mean()),
        })
    summary = {
        "target": request.target, "pairs": len(ii), "reps": bt.reps, "n_items": n, "looks": _looks(bt),
        "margin": request.margin, "fraction_used": float(used.mean() / n), "separated": float(directional.mean()),
        "separated_before_exhaustion": float((directional & (used < n)).mean()),
        "equivalent": float((verdicts == EQUIVALENT).mean()),
        "full_bank_separated": float(np.isin(truth, (A_GT_B, B_GT_A)).mean()),
        "agreement": float((verdicts == truth).mean()), "coverage": float(covered.mean()),
        "directional_error_rate": float((wrong & directional).mean()),
        "equivalence_error_rate": float((wrong & (verdicts == EQUIVALENT)).mean()),
        "guarantee": guarantee,
    }
    return {"pairs": pairs, "summary": summary}


def rank_backtest(bt: ComparativeBacktest) -> dict[str, Any]:
    """Rankings of every model over ``reps`` orders; a family-wise error is any wrong ordering statement against
    the exact bank differences."""
    m, n = bt.matrix.shape
    exact = bt.exact
    rows = bt.fan_out([bt.cell()])
    rankings = _entries(rows)
    mean = lambda key: float(np.mean([r[key] for r in rows]))  # noqa: E731
    m = bt.run_models
    summary = {
        "target": bt.request.target, "models": m, "pairs": m * (m - 1) // 2, "reps": bt.reps, "n_items": n,
        "looks": _looks(bt), "margin": bt.request.margin, "fraction_used": mean("fraction_used"),
        "tie_groups_mean": mean("n_tie_groups"), "models_leaving_early": mean("models_leaving_early"),
        "family_wise_error_rate": float(np.mean([r["errors"] > 0 for r in rows])), "wall_s_per_rep": mean("wall_s"),
        "kendall_tau_mean": mean("kendall_tau"), "simultaneous_coverage": _coverage(rows),
        "guarantee": rows[-1]["guarantee"], "full_bank_order": [bt.models[k] for k in np.argsort(-exact, kind="stable")],
        "statement": "strict" if bt.request.epsilon is None else "epsilon", "epsilon": bt.request.epsilon,
        "construction": _construction(bt.request) if bt.history_fraction is None else "history",
        **bt.history_summary(), **_without_history(rows),
    }
    return {"rankings": rankings, "summary": summary}


def _without_history(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """With a history share: the cells the same models use on the same orders without history, and the ratio."""
    plain = [r["fraction_used_without_history"] for r in rows if "fraction_used_without_history" in r]
    if not plain:
        return {}
    used = float(np.mean([r["fraction_used"] for r in rows]))
    return {"fraction_used_without_history": float(np.mean(plain)),
            "history_vs_without": used / float(np.mean(plain)) if np.mean(plain) > 0 else None}


def _coverage(rows: list[dict[str, Any]]) -> float | None:
    """The share of reps whose per-model intervals all held the exact bank means (None: none reported)."""
    seen = [r["all_intervals_cover"] for r in rows if r.get("all_intervals_cover") is not None]
    return float(np.mean(seen)) if seen else None


def select_backtest(bt: ComparativeBacktest) -> dict[str, Any]:
    """Selections over ``reps`` orders: top-K within epsilon (bank target) or the models precise enough above
    the threshold (distribution target); errors against the exact bank means."""
    m, n = bt.matrix.shape
    exact, request = bt.exact, bt.request
    top, epsilon, threshold = request.top or 1, request.halfwidth or 0.0, request.threshold or 0.0
    rows = bt.fan_out([bt.cell()])
    runs = _entries(rows)
    errors = [bool(x["wrong"]) for x in runs]
    summary = {
        "target": request.target, "models": bt.run_models, "reps": bt.reps, "n_items": n, "threshold": threshold,
        "fraction_used": float(np.mean([x["fraction_used"] for x in runs])),
        "discarded_mean": float(np.mean([len(x["discarded"]) for x in runs])),
        # of the models run: every model, or (with a history share) the mean over reps
        "truly_below": (int((exact < threshold).sum()) if bt.history_fraction is None
                        else float(np.mean([x["truly_below"] for x in runs]))),
        "error_rate": float(np.mean(errors)),
        "wrong_discard_rate": float(np.mean(errors)),
        "simultaneous_coverage": float(np.mean([x["all_intervals_cover"] for x in runs])),
        **({"top": top, "epsilon": epsilon} if request.target == "bank" else {"halfwidth": epsilon}),
        "guarantee": rows[-1]["guarantee"], **bt.history_summary(), **_without_history(runs),
    }
    return {"runs": runs, "summary": summary}


def _construction(request: Any) -> str | None:
    """The ε-ranking's construction (None for strict verdicts or with a history share)."""
    if request.epsilon is None or request.kind != "rank":
        return None
    from certeval.estimators.groups import epsilon_ranking_construction

    return epsilon_ranking_construction(request)


def _looks(bt: ComparativeBacktest) -> list[int]:
    n = bt.spec.n_items
    cap = n if bt.max_items is None else min(n, int(bt.max_items))
    return list(range(bt.looks_every, cap, bt.looks_every)) + [cap]


__all__ = ["ComparativeBacktest", "compare_backtest", "load_matrix", "rank_backtest", "select_backtest"]
