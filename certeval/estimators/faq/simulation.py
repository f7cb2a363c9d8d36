"""FAQ (Wu et al. 2026, arXiv:2601.20251) for many independent runs at once, vectorised: backtests and unbiasedness / coverage studies.
Draw for draw the same as the ``faq`` method (:mod:`certeval.estimators.faq.querying`) driven with the same ``rng``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from certeval.errors import InputError

from .querying import (
    DEFAULT_SCHEDULE,
    FactorPrior,
    Schedule,
    draw_items,
    hybrid_policy,
    laplace_update,
    model_second_moment,
    pai_terms,
    predict_probs,
)


def simulate_faq(truth: np.ndarray, factors: FactorPrior, n_draws: int,
                 rng: np.random.Generator | Sequence[np.random.Generator], *, schedule: Schedule = DEFAULT_SCHEDULE,
                 weights: np.ndarray | None = None, batch_size: int = 1) -> dict[str, np.ndarray]:
    """Run FAQ for ``R`` independent runs at once; ``truth`` is (R, N) (the scores each run would observe), the
    policy follows ``schedule`` from the prior ``factors``.

    Returns per-draw arrays of shape (R, n_draws): ``item``, ``z``, ``p_item``, ``q_item``, ``w_item``,
    ``plug_in``. Identical, draw for draw, to the ``faq`` method driven with the same ``rng`` and batch
    size when R = 1. Rounds of ``batch_size`` draws share one policy; the posterior absorbs each score in turn.
    ``rng`` may also be one generator per run: run ``i`` then draws from ``rng[i]`` alone, exactly as the ``faq``
    method driven with that generator, whichever other runs share the call (backtest reps seeded one by one).
    """
    truth = np.atleast_2d(np.asarray(truth, dtype=float))
    r, n = truth.shape
    v = np.asarray(factors.item_factors, dtype=float)
    if v.shape[0] != n:
        raise InputError(f"item_factors must have one row per item ({n}), got {v.shape}")
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=float)
    mean = np.tile(np.asarray(factors.prior_mean, dtype=float), (r, 1))
    cov = np.tile(np.asarray(factors.prior_cov, dtype=float), (r, 1, 1))
    out = {key: np.zeros((r, n_draws)) for key in ("z", "p_item", "q_item", "w_item", "plug_in", "model_m2")}
    out["item"] = np.zeros((r, n_draws), dtype=np.int64)
    rows = np.arange(r)
    if isinstance(rng, np.random.Generator):
        def uniforms(k: int) -> np.ndarray:
            return rng.random((r, k))
    else:
        gens = list(rng)
        if len(gens) != r:
            raise InputError(f"rng must be one generator or one per run ({r}); got {len(gens)} generators")

        def uniforms(k: int) -> np.ndarray:  # each run's k next draws from its own stream
            return np.stack([g.random(k) for g in gens]) if r else np.zeros((0, k))
    step = 0
    while step < n_draws:
        k = min(batch_size, n_draws - step)
        p = predict_probs(mean, v)
        q = hybrid_policy(p, cov, v, w, step=step, schedule=schedule)
        items = draw_items(q, uniforms(k))
        plug = p @ w
        m2 = model_second_moment(p, q, w)
        for j in range(k):
            it = items[:, j]
            z = truth[rows, it]
            s = step + j
            out["item"][:, s] = it
            out["z"][:, s] = z
            out["p_item"][:, s] = p[rows, it]
            out["q_item"][:, s] = q[rows, it]
            out["w_item"][:, s] = w[it]
            out["plug_in"][:, s] = plug
            out["model_m2"][:, s] = m2
            mean, cov = laplace_update(mean, cov, v[it], z)
        step += k
    return out


def terms_from_simulation(sim: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return pai_terms(sim["z"], sim["p_item"], sim["q_item"], sim["w_item"], sim["plug_in"])
