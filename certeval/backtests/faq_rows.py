"""The rows of a ``faq-budget`` backtest cell: FAQ (Wu et al. 2026) and uniform sampling side by side at fixed
budgets, one (model, rep) run per row. Pure: no driver, no printing; the one backtest driver calls
:func:`faq_budget_rows` through the table of cell kinds (:mod:`certeval.backtests.kinds`), and
:mod:`certeval.backtests.faq` summarises the rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from certeval.estimators.faq.querying import CI_KINDS, FactorPrior, Schedule, pai_interval
from certeval.estimators.faq.simulation import simulate_faq, terms_from_simulation

from .cells import Cell, DatasetArrays, rep_seed

DEFAULT_TAU = 0.1


def uniform_runs(truth: np.ndarray, budgets: Sequence[int], confidence: float,
                 rngs: Sequence[np.random.Generator]) -> tuple[np.ndarray, np.ndarray]:
    """Uniform sampling without replacement, one run per row of ``truth`` from its own generator:
    (estimates, half-widths) of shape (rows, budgets); each budget's sample is a prefix of the row's one order.

    Sample mean with the finite-population Wald interval t_{n−1} s/√n √(1 − n/N).
    """
    r, n = truth.shape
    picks = np.argsort(np.stack([g.random(n) for g in rngs]), axis=1) if r else np.zeros((0, n), dtype=np.int64)
    est = np.empty((r, len(budgets)))
    half = np.empty((r, len(budgets)))
    for k, b in enumerate(budgets):
        x = np.take_along_axis(truth, picks[:, :b], axis=1)
        tq = stats.t.ppf(0.5 + confidence / 2.0, max(b - 1, 1))
        est[:, k] = x.mean(axis=1)
        half[:, k] = tq * x.std(axis=1, ddof=1) / math.sqrt(b) * math.sqrt(max(1.0 - b / n, 0.0))
    return est, half


def faq_budget_rows(data: DatasetArrays, cell: Cell, rep_lo: int, rep_hi: int, root_seed: int) -> list[dict[str, Any]]:
    """Reps ``rep_lo..rep_hi-1`` of a ``faq-budget`` cell (the driver's ``run_chunk`` calls this).

    Rep ``r`` evaluates ``data.models[r % M]``: FAQ up to the largest budget (smaller budgets are its prefixes)
    and uniform sampling beside it, from two children of the rep's seed. The chunk's FAQ runs go through
    :func:`simulate_faq` at once, each with its own generator, so a rep's numbers do not depend on the chunk.
    """
    params = dict(cell.params)
    budgets = [int(b) for b in params["budgets"]]
    confidence, tau = float(params.get("confidence", 0.95)), float(params.get("tau", DEFAULT_TAU))
    reps = list(range(rep_lo, rep_hi))
    idx = [rep % len(data.models) for rep in reps]
    seeds = [rep_seed(root_seed, data.name, data.models[i], cell.name, rep).spawn(2) for rep, i in zip(reps, idx)]
    truth = data.matrix[idx]
    arrays = data.faq or {}
    prior = FactorPrior(arrays["item_factors"], arrays["prior_mean"], arrays["prior_cov"])
    sim = simulate_faq(truth, prior, max(budgets), [np.random.default_rng(s[0]) for s in seeds],
                       schedule=Schedule(tau), batch_size=cell.batch_size)
    terms = terms_from_simulation(sim)
    u_est, u_half = uniform_runs(truth, budgets, confidence, [np.random.default_rng(s[1]) for s in seeds])
    at = []
    for b in budgets:
        prefix = {key: terms[key][:, :b] for key in ("phi", "corr", "ipw", "plug_in")}
        kinds = {kind: np.column_stack(pai_interval(prefix, confidence, kind, planned_n=b)[:3]) for kind in CI_KINDS}
        distinct = [len(np.unique(items[:b])) for items in sim["item"]]
        at.append((b, kinds, distinct))
    return [{"dataset": data.name, "method": cell.name, "goal": cell.goal, "rep": rep, "model": data.models[i],
             "budgets": [{"budget": b, **{kind: [float(v) for v in kinds[kind][j]] for kind in CI_KINDS},
                          "uniform": [float(u_est[j, k]), float(u_half[j, k])], "distinct": int(distinct[j])}
                         for k, (b, kinds, distinct) in enumerate(at)]}
            for j, (rep, i) in enumerate(zip(reps, idx))]
