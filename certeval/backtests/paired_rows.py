"""The rows of a ``paired`` backtest cell: one paired run per rep (compare, rank or select) on a recorded matrix,
checked against the exact bank means of the models it ran. Pure: no driver, no printing; the one backtest driver
(:func:`certeval.backtests.ray_fanout.run_cells`) calls :func:`paired_rows` through the table of cell kinds
(:mod:`certeval.backtests.kinds`), and :mod:`certeval.backtests.comparative` summarises the rows."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from certeval.engine import PairedRounds, paired_order_rng, run_paired
from certeval.estimators.distribution.comparison import A_GT_B, B_GT_A, EQUIVALENT
from certeval.estimators.groups import GroupRequest

from .cells import Cell, DatasetArrays, rep_seed


def _statement_errors(verdict: np.ndarray, true_diff: np.ndarray, margin: float) -> np.ndarray:
    """Wrong ordering statements against the exact bank differences: a>b claims a difference above the
    margin, b>a below -margin, equivalent inside [-margin, margin]."""
    tol = 1e-9  # exact differences equal to the margin, up to floating point
    return (((verdict == A_GT_B) & (true_diff <= margin - tol)) | ((verdict == B_GT_A) & (true_diff >= -margin + tol))
            | ((verdict == EQUIVALENT) & (np.abs(true_diff) > margin + tol)))


def _cell_rows(data: DatasetArrays, cell: Cell) -> np.ndarray:
    """The matrix rows a paired cell runs together (every model when the cell names none)."""
    return np.arange(len(data.models)) if cell.rows is None else np.asarray(cell.rows)


def history_count(models: int, fraction: float) -> int:
    """History models of a rep: ``round(fraction · models)``, at least one, leaving at least two to run."""
    return min(max(1, int(round(fraction * models))), models - 2)


def history_split(rows: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A rep's random split of ``rows`` into :func:`history_count` history rows and the rows run, both sorted."""
    k = history_count(len(rows), fraction)
    perm = rng.permutation(rows)
    return np.sort(perm[:k]), np.sort(perm[k:])


def _rep_request(data: DatasetArrays, cell: Cell, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Any]:
    """The rows a rep runs, its history rows (empty without a history share) and its request: with
    ``cell.history_fraction`` a random share of the cell's rows is history — one factor model fitted on their
    recorded scores (:func:`~certeval.inputs.history.matrix_prior`, as the single-model backtests fit theirs) is every run
    model's prior."""
    rows = _cell_rows(data, cell)
    if cell.history_fraction is None:
        return rows, rows[:0], replace(cell.request, labels=tuple(data.models[k] for k in rows))
    from certeval.inputs.history import matrix_prior

    hist, run = history_split(rows, cell.history_fraction, rng)
    labels = tuple(data.models[k] for k in run)
    prior = matrix_prior(data.matrix[hist], [data.models[k] for k in hist])
    return run, hist, replace(cell.request, labels=labels, history={label: prior for label in labels})


def play_paired(data: DatasetArrays, rows: np.ndarray, request: Any, cell: Cell,
                rng: np.random.Generator) -> PairedRounds:
    """One paired run of the models ``rows`` under ``request`` on an order drawn from ``rng``, scores looked up in
    ``data``."""
    rounds = PairedRounds(request, n_items=data.spec.n_items, batch_size=cell.batch_size, max_items=cell.max_items)
    return run_paired(rounds.start(data.spec, rng), data.matrix[rows])


# what a rep row carries beside the entry a summary lists per rep
_ROW_ONLY = ("dataset", "method", "goal", "wall_s", "guarantee")


def paired_rows(data: DatasetArrays, cell: Cell, rep_lo: int, rep_hi: int, root_seed: int) -> list[dict[str, Any]]:
    """Reps ``rep_lo..rep_hi-1`` of a ``paired`` cell (the driver's ``run_chunk`` calls this): one paired run
    each, checked against the exact bank means of the models it ran; rep 0 of rank and select also records the run
    in detail. With a history share, each rep first splits the cell's models (:func:`_rep_request`)."""
    group = "|".join(data.models[k] for k in _cell_rows(data, cell))  # the seed: the cell's models, never the chunk
    check = {"compare": _compare_rep, "rank": _rank_rep, "select": _select_rep}[cell.request.kind]
    out = []
    for rep in range(rep_lo, rep_hi):
        rng = (paired_order_rng(root_seed + rep) if cell.live_order
               else np.random.default_rng(rep_seed(root_seed, data.name, group, cell.name, rep)))
        rows, hist, request = _rep_request(data, cell, rng)
        # the run's own models, whose exact bank means its statements are checked against
        run = DatasetArrays(data.name, data.spec, tuple(data.models[k] for k in rows), data.matrix[rows])
        exact = run.matrix @ run.spec.weights()
        plain_rng = copy.deepcopy(rng)  # the same order for the run without history
        start = time.perf_counter()
        rounds = play_paired(data, rows, request, cell, rng)
        res = rounds.outcome
        wall = time.perf_counter() - start
        extra = {}
        if cell.history_fraction is not None:
            # what the history saved: the same models on the same order without it
            plain = play_paired(data, rows, replace(request, history=None), cell, plain_rng).outcome
            extra = {"history_models": [data.models[k] for k in hist],
                     "fraction_used_without_history": float(plain.fraction_used)}
        if cell.request.kind == "rank" and cell.request.target == "bank":  # the group's per-model intervals
            extra["all_intervals_cover"] = _intervals_cover(rounds.intervals, run.models, exact)
        out.append({"dataset": data.name, "method": cell.name, "goal": cell.goal, "rep": rep,
                    **check(res, rep, rows, run, exact, request), **extra,
                    "wall_s": wall, "guarantee": res.guarantee})
    return out


def _intervals_cover(intervals: dict[str, tuple[float, float, float, int]], models: Sequence[str],
                     exact: np.ndarray) -> bool | None:
    """Whether every model's interval holds its exact bank mean (None: the group reports no intervals)."""
    if not intervals:
        return None
    return all(intervals[name][1] <= exact[k] + 1e-12 and exact[k] <= intervals[name][2] + 1e-12
               for k, name in enumerate(models) if name in intervals)


def _compare_rep(res: Any, rep: int, rows: np.ndarray, data: DatasetArrays, exact: np.ndarray,
                 request: GroupRequest) -> dict[str, Any]:
    diff = exact[0] - exact[1]
    return {"pair": [int(rows[0]), int(rows[1])], "verdict": res.verdict, "n_items": int(res.n_items),
            "covered": bool(res.lower <= diff + 1e-12 and diff <= res.upper + 1e-12)}


def _rank_rep(res: Any, rep: int, rows: np.ndarray, data: DatasetArrays, exact: np.ndarray,
              request: GroupRequest) -> dict[str, Any]:
    table = res.pairs
    if res.epsilon is None:
        errors = int(_statement_errors(table.verdict, exact[table.a] - exact[table.b], request.margin).sum())
    else:
        errors = epsilon_errors(res, data.models, exact)
    entry = {"rep": rep, "fraction_used": res.fraction_used, "errors": errors, "n_tie_groups": len(res.tie_groups),
             "models_leaving_early": float(np.mean(np.asarray(res.items_used) < data.spec.n_items)),
             "tie_groups": [list(g) for g in res.tie_groups], "kendall_tau": kendall_tau(res, data.models, exact)}
    if rep == 0:
        entry.update(models=list(res.models), means=list(res.means), items_used=list(res.items_used))
        if len(table) <= 5000:
            entry["comparisons"] = [c.to_dict() for c in res.comparisons]
    return entry


def _select_rep(res: Any, rep: int, rows: np.ndarray, data: DatasetArrays, exact: np.ndarray,
                request: GroupRequest) -> dict[str, Any]:
    row = {name: k for k, name in enumerate(data.models)}
    top, epsilon, threshold = request.top or 1, request.halfwidth or 0.0, request.threshold or 0.0
    kth = np.sort(exact)[::-1][min(top, len(data.models)) - 1]
    bad = [s.model for s in res.models if s.status == "below" and exact[row[s.model]] >= threshold]
    if request.target == "bank":  # the statement: every selected mean >= every unselected one's - epsilon
        below = {s.model for s in res.models if s.status == "below" and exact[row[s.model]] < threshold}
        rivals = [exact[row[name]] for name in data.models if name not in res.selected and name not in below]
        ref = max([kth, *rivals])
        bad += [name for name in res.selected if exact[row[name]] < ref - epsilon]
    covered = all(s.lower <= exact[row[s.model]] + 1e-12 and exact[row[s.model]] <= s.upper + 1e-12
                  for s in res.models)
    return {"rep": rep, "fraction_used": res.fraction_used, "selected": list(res.selected),
            "truly_below": int((exact < threshold).sum()),
            "discarded": list(res.discarded), "wrong": bad, "all_intervals_cover": covered,
            **({"models": [vars(s) for s in res.models]} if rep == 0 else {})}


def kendall_tau(ranking: Any, models: Sequence[str], exact: np.ndarray) -> float:
    """Kendall's tau-b between the ranking's tie groups (models of one group tied) and the exact bank means."""
    from scipy.stats import kendalltau

    group = {name: g for g, members in enumerate(ranking.tie_groups) for name in members}
    tau = kendalltau([-group[name] for name in models], exact).statistic
    return float(tau) if np.isfinite(tau) else 0.0


def epsilon_errors(ranking: Any, models: Sequence[str], exact: np.ndarray) -> int:
    """Wrong epsilon-statements of a ranking: pairs in two tie groups whose higher-listed model's exact bank mean
    is below the lower one's minus epsilon (in blocks of rows: 10,000 models never hold a 10⁸ matrix)."""
    group = {name: g for g, members in enumerate(ranking.tie_groups) for name in members}
    g = np.array([group[name] for name in models])
    exact = np.asarray(exact, dtype=float)
    wrong = 0
    for lo in range(0, len(g), 1000):
        above = g[lo:lo + 1000, None] < g[None, :]
        wrong += int((above & (exact[lo:lo + 1000, None] < exact[None, :] - ranking.epsilon - 1e-9)).sum())
    return wrong
