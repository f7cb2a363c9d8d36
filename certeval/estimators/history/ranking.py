"""``rank --history`` at any scale: the bank ranking's pair confidence sequences with each pair's predicted
difference as control variate, vectorised over the pairs.

Every ranked model k has a :class:`~.prior.HistoryPrior` (a factor model fitted on other models' recorded
scores). Before each look, each model's prediction ``p_kj`` of every item is refitted on its own scores of the
earlier looks (the posterior mean of :meth:`HistoryPrior.predict`, one small solve per prior and the models
sharing it): an ``M × N`` matrix. The shared order means every model has scored the same items, so nothing
per pair is fitted: pair (a, b)'s prediction of ``z_j = (x_aj − x_bj + 1)/2`` is ``(p_aj − p_bj + 1)/2``,
formed for the look's items only, and the predicted rest ``Σ_{undrawn} w_j (p_aj − p_bj + 1)/2`` comes from
the per-model sums. Memory O(M·N + P) (P = M(M−1)/2 pair streams), never P × N.

History is weighed by what it has shown it predicts, as in ``compare --history``: every model's control variate
is ``a_kj = z_kj + ρ (p_kj − z_kj)``, with ``z_kj`` model k's running mean in item j's sub-dataset (shrunk to ½ by
one pseudo-item: what the run without history knows) and ONE trust ρ for all models and pairs (so each pair's
control is ``(a_aj − a_bj + 1)/2``, the difference of its models'). ρ is measured out of sample on the pairs'
differences: over the items of earlier looks, with the ``p`` and ``z`` each look was run with, the least-squares
slope of ``x − z`` on ``p − z`` after centring both across the models that scored the item (over all pairs,
``Σ_{a<b} (u_a − u_b)(v_a − v_b) = M Σ_k (u_k − ū)(v_k − v̄)``: the slope of the pairs' differences, in O(M) per
item); ρ = 0 unless a one-sided t-test at level ``TRUST_TEST_LEVEL`` finds the slope positive, then James–Stein
shrunk (:func:`~certeval.estimators.single.history.trust_from_sums`); ``trust_start`` before any look. Useless history gets ρ = 0:
each pair's control is then its models' running-mean difference per sub-dataset.

Each pair's stream is :class:`~certeval.estimators.bank.wor_streams.ControlledStreams` (the plain bank ranking's without-replacement
betting CS, or its empirical-Bernstein CS beyond tens of models, on ``(z − a + 1)/2``): exact (width 0 once the
bank is scored) and anytime-valid whatever the history is, since the predictions of a look are fixed before its
scores are seen. Each pair runs at level ``alpha / P`` (Bonferroni, as :class:`~certeval.estimators.bank.ranking.BankRanking`,
whose verdicts, ε-statements and tie groups this class keeps; its per-model intervals, at ``alpha / M``, take each
model's own prediction as control variate, as ``certify --history``). With ε, the listings are
certified by the bank ranking's boundary tests (:mod:`certeval.estimators.bank.epsilon_tests`) on the same controlled values, and the pair
intervals, reported only, are the O(1) empirical-Bernstein CSs whatever M (as in the plain ranking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..bank.ranking import PAIR_BLOCK_CELLS, BankRanking
from ..bank.wor_streams import ControlledWorStreams, make_controlled_streams
from ..single.history import TRUST_START, HistoryMethod, trust_from_sums
from ..validation import check_item_indices

GUARANTEE = ("bank target, anytime-valid and exact: without-replacement betting confidence sequences (Waudby-Smith "
             "& Ramdas 2020; empirical-Bernstein beyond tens of models) on each pair's paired difference minus its "
             "history prediction (each model's factor-model prediction refitted before every look on its own "
             "earlier scores), items drawn in proportion to their weights; valid whatever the history")


class HistoryPredictions:
    """Every model's current prediction of every item (``pred``, ``M × N``), refitted on the scored items."""

    def __init__(self, priors: Sequence[Any], n_items: int) -> None:
        groups: dict[int, list[int]] = {}
        self.priors: list[Any] = []
        for k, prior in enumerate(priors):
            if prior.n_items != n_items:
                raise InputError(f"history prior of model {k} describes {prior.n_items} items, the bank {n_items}")
            groups.setdefault(id(prior), []).append(k)
        self.groups = [(priors[ks[0]], np.asarray(ks, dtype=np.int64)) for ks in groups.values()]
        self.pred = np.empty((len(priors), n_items))
        for prior, ks in self.groups:
            self.pred[ks] = np.clip(prior.item_mean, 0.0, 1.0)

    def refit(self, models: np.ndarray, seen: np.ndarray, scores: np.ndarray) -> None:
        """Refit ``models`` (rows of ``scores``, ``M × N``) on the bank positions ``seen`` (sorted)."""
        want = np.zeros(self.pred.shape[0], dtype=bool)
        want[models] = True
        for prior, ks in self.groups:
            ks = ks[want[ks]]
            if ks.size == 0 or seen.size == 0:
                continue
            phi = np.column_stack([np.ones(prior.n_items), prior.factors])
            phi_s = phi[seen]
            prec = phi_s.T @ phi_s / prior.noise_var + np.diag(
                1.0 / np.concatenate([[prior.offset_var], prior.loading_var]))
            resid = scores[np.ix_(ks, seen)] - prior.item_mean[seen][None, :]
            theta = np.linalg.solve(prec, phi_s.T @ resid.T / prior.noise_var)  # (factors + 1, models)
            self.pred[ks] = np.clip(prior.item_mean[None, :] + (phi @ theta).T, 0.0, 1.0)


class HistoryRanking(BankRanking):
    """A bank-target ranking whose pair CSs use each pair's predicted difference as control variate (see the
    module docstring). Ready to ``update(items, scores)`` once built (a look of the shared order drawn ∝ weight:
    bank positions and ``(M, b)`` scores; rows of models that left are ignored); ``result()`` a
    :class:`~certeval.estimators.distribution.ranking.Ranking`. Any number of models: O(M·N) for the predictions and the scores seen."""

    MAX_MODELS = None  # no cap: the pairs are vectorised (rank --history used to stop at 30 models)
    TRUST_TEST_LEVEL = HistoryMethod.TRUST_TEST_LEVEL

    def __init__(self, names: Sequence[str], priors: Sequence[Any], spec: Any, *, alpha: float = 0.05,
                 margin: float = 0.0, epsilon: float | None = None, bet_horizon: int | None = None) -> None:
        super().__init__(names, alpha=alpha, margin=margin, epsilon=epsilon)
        if len(priors) != len(self.names):
            raise InputError(f"one history prior per model: {len(self.names)} models, {len(priors)} priors")
        self.priors = tuple(priors)
        self.start(spec.weights(), bet_horizon=bet_horizon)
        p = len(self.pa)
        # with ε the boundary tests decide and the intervals are only reported: the O(1) empirical-Bernstein CSs,
        # as in the plain ranking (a betting grid per pair made a 188-model run 100× slower and 1.3 GiB larger)
        self.pairs = (make_controlled_streams(p, self.n_total, self.alpha / p, bet_horizon) if self.tests is None
                      else ControlledWorStreams(p, self.n_total, self.alpha / p))
        # each model's own interval (reported beside the ranking) learns from its prediction too, as certify --history
        self.models = make_controlled_streams(len(self.names), self.n_total, self.alpha / len(self.names), bet_horizon)
        self.predictions = HistoryPredictions(self.priors, self.n_total)
        self.drawn = np.zeros(self.n_total, dtype=bool)
        self.seen_scores = np.full((len(self.names), self.n_total), np.nan)
        # the trust: running means per sub-dataset (the no-history prediction z), and the out-of-sample fit sums
        self.cells = spec.subset_codes()
        m, c = len(self.names), int(self.cells.max()) + 1
        self.cell_sum, self.cell_n = np.zeros((m, c)), np.zeros((m, c))
        self.trust_sums = np.zeros(3)  # Σ d̃², Σ d̃ỹ, Σ ỹ² over the centred (model, item) cells of earlier looks
        self.trust_dof = 0
        self.trust = TRUST_START
        self.control = self._controls()

    def _running_means(self) -> np.ndarray:
        """z: each model's running mean in every item's sub-dataset, shrunk to ½ by one pseudo-item (M × N)."""
        return ((0.5 + self.cell_sum) / (1.0 + self.cell_n))[:, self.cells]

    def _controls(self) -> np.ndarray:
        """Every model's control variate ``z + ρ (p − z)`` of every item (M × N), fixed before the next look."""
        z = self._running_means()
        return np.clip(z + self.trust * (self.predictions.pred - z), 0.0, 1.0)

    def _measure_trust(self, live: np.ndarray, items: np.ndarray, y: np.ndarray) -> None:
        """Add the look's out-of-sample cells (its own controls' parts, fixed before its scores) to the trust's fit;
        ρ for the next look. Centred across the live models per item: the pairs' differences, not item difficulty."""
        if live.size < 2:
            return
        z = self._running_means()[np.ix_(live, items)]
        d = self.predictions.pred[np.ix_(live, items)] - z
        r = y[live] - z
        d, r = d - d.mean(axis=0), r - r.mean(axis=0)
        self.trust_sums += (float(np.sum(d * d)), float(np.sum(d * r)), float(np.sum(r * r)))
        self.trust_dof += d.size - items.size  # one degree of freedom per item goes to the centring
        self.trust = trust_from_sums(*self.trust_sums, self.trust_dof - 1, self.TRUST_TEST_LEVEL)

    def _model_controls(self, live: np.ndarray, items: np.ndarray) -> np.ndarray:
        control = self.control  # fixed before this look's scores: from the earlier looks only
        self.models.rest[live] = control[live] @ np.where(self.drawn, 0.0, self.w)  # Σ_undrawn w a_k per model
        return control[np.ix_(live, items)]

    def update(self, items: Any, scores: Any) -> HistoryRanking:
        positions = check_item_indices(items, self.n_total)  # the shared order's rule, before anything changes
        if self.drawn[positions].any() or np.unique(positions).size != positions.size:
            raise InputError("a look of the shared order names an item twice or one of an earlier look")
        look = self._begin_look(items, scores)
        if look is None:
            return self
        items, live, y, w = look
        if len(self.open_idx):
            pred = self.control  # fixed before this look's scores: from the earlier looks only
            undrawn_w = np.where(self.drawn, 0.0, self.w)
            s, u = pred @ undrawn_w, float(undrawn_w.sum())
            oa, ob = self.open_a, self.open_b
            self.pairs.rest = (s[oa] - s[ob] + u) / 2.0  # Σ_undrawn w (p_a − p_b + 1)/2 per pair
            if self.tests is not None:  # the ε-listings' boundary tests, on the same controlled values
                self.tests.rest = self.pairs.rest.copy()
            step = max(1, PAIR_BLOCK_CELLS // len(self.open_idx))
            for lo in range(0, items.size, step):
                yc, pc = y[:, lo:lo + step], pred[:, items[lo:lo + step]]
                z, a = (yc[oa] - yc[ob] + 1.0) / 2.0, (pc[oa] - pc[ob] + 1.0) / 2.0
                self.pairs.absorb(z, w[lo:lo + step], a)
                if self.tests is not None:
                    self.tests.absorb(z, w[lo:lo + step], a)
            self._decide_pairs()
        self._measure_trust(live, items, y)  # before the refit: the parts this look was run with
        self.drawn[items] = True
        self.seen_scores[live[:, None], items[None, :]] = y[live]
        np.add.at(self.cell_sum, (live[:, None], self.cells[items][None, :]), y[live])
        np.add.at(self.cell_n, (live[:, None], self.cells[items][None, :]), 1.0)
        still = np.flatnonzero(self.model_open)
        if still.size and self.n < self.n_total:  # the next look's controls, from the scores seen so far
            self.predictions.refit(still, np.flatnonzero(self.drawn), self.seen_scores)
            self.control = self._controls()
        return self

    def guarantee(self) -> str:
        p = len(self.pa)
        what = "every ordering statement" if self.epsilon is None else (
            f"the epsilon-statements: every model listed in a higher tie group has a bank mean at least that of "
            f"every model in a lower group minus {self.epsilon:g},")
        how = "" if self.tests is None else (
            " (the listings certified by two one-sided without-replacement betting tests per pair on the same "
            "controlled values, disjoint nulls, each test at the pair's level; the pair intervals reported beside "
            "them are the empirical-Bernstein confidence sequences)")
        return f"{GUARANTEE}; family-wise over {what} by Bonferroni over the {p} pairs (each at alpha/{p}){how}"

    def state(self) -> dict[str, Any]:
        raise InputError("rank --history keeps no resumable state (its predictions are refitted from the scores)")

    def describe_history(self) -> dict[str, Any]:
        return self.priors[0].describe() if self.priors else {}
