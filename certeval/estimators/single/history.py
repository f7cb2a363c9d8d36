"""``history``: an exact, anytime-valid interval for the bank's mean that learns from other models' scores.

The idea (prediction-powered / active statistical inference, made exact for a finite bank)
------------------------------------------------------------------------------------------
The bank's estimand is ``m = Σ_j w_j x_j`` (``w = BankSpec.weights()``: the plain mean or the
mean-of-means over sub-datasets). Other models' recorded scores on the same items
(:class:`~certeval.estimators.history.prior.HistoryPrior`) give a prediction ``a_j`` of every item's score for
the model under evaluation, refitted on that model's own scores before every batch. Write
``m = Σ_j w_j a_j + Σ_j w_j (x_j − a_j)``: the first sum is known, so only the residuals need sampling,
and they vary much less than the scores when the history is informative (Angelopoulos et al. 2023,
prediction-powered inference; Zrnic & Candès 2024, active statistical inference). Those results are
asymptotic or fixed-n; here the residual mean gets a without-replacement betting confidence sequence
(Waudby-Smith & Ramdas, NeurIPS 2020; JRSS-B 2024), which is exact and valid at any stopping time.

Draws and the martingale
------------------------
Before draw i the undrawn items are ``R_i`` with weight ``U_i = Σ_{R_i} w_j``; ``K_i`` is the weighted
sum of the scores already drawn. Draw i picks ``J ∈ R_i`` with a known probability
``π_j = s_j / S_i`` (``S_i = Σ_{R_i} s_j``), ``s_j = w_j ((1 − η) σ_j/σ̄ + η)``: more draws where the
predicted residual spread ``σ_j = sqrt(a_j (1 − a_j))`` is large (Neyman's allocation), mixed with
draws in proportion to the weight (share η) so that every item can be drawn and the importance weights
stay bounded. η starts at 1 and decays to ``uniform_mix`` as ``η = η∞ + (1 − η∞) n₀/(n₀ + n)`` after n
scored items (``warmup`` = n₀ = 50). Importance weights widen Y's range, which the truncated bets pay for
when they are large, so before each batch the method predicts the width both laws would reach where its bets
are tuned to stop (``ControlVariateCS.predicted_width``) and draws ∝ w unless the Neyman mix is predicted
narrower: short horizons and wide goals stay ∝ w, long ones go active (measured at n = 100, 100 reps with
common seeds: always-active draws were 3–5% wider than ∝ w on four banks, the chosen law 0.98–1.01×).
A batch of k draws is successive sampling (exponential keys,
Efraimidis & Spirakis 2006), so each draw has exactly that law given the earlier ones. With

    ``Y_i = Σ_{j∈R_i} (w_j/U_i) a_j + (w_J / (U_i π_J)) (x_J − a_J)``,

``E[Y_i | past] = Σ_{R_i} (w_j/U_i) x_j = (m − K_i)/U_i =: ν_i(m)``, affine and increasing in m, and
``Y_i`` lies in a known range (worst case over the items that could be drawn). Every ``a_j``, ``π_j``
and the bet are fixed before draw i (predictable), so the hedged capital
``½∏(1 + λ⁺(Y − ν(m))) + ½∏(1 − λ⁻(Y − ν(m)))`` is a nonnegative martingale at the true m
(:class:`~certeval.estimators.single.adaptive.ControlVariateCS`), and Ville's inequality gives

    P(∃ t: m ∉ [lower_t, upper_t]) ≤ δ

under any stopping rule, whatever the history is: useless or adversarial history costs items, never
validity. The interval is intersected with the deterministic bounds of the bank, so its width is
exactly 0, at the exact bank mean, once every item is scored. The control variate ``a_j`` is
the history's prediction only as far as it has shown it predicts: ``a_j = z_j + ρ (h_j − z_j)``, with ``z_j`` the
running mean of the model's scores in j's sub-dataset and ``ρ`` measured on draws already scored
(:meth:`HistoryMethod.history_trust`), so useless history falls back to the run without it. The bets' variance is
the predicted ``Var(Y)`` times a calibration factor (observed / predicted squared residuals, shrunk to 1).
Per-subset intervals (mean-of-means banks) are the same construction for each sub-dataset's mean;
each holds with probability ≥ 1 − δ on its own (the overall one needs no union bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from certeval.errors import InputError

from ..protocol import BankMethod, register
from ..results import Estimate, SubsetEstimate
from ..validation import check_in_range, check_positive_int
from .adaptive import DrawLogReplay
from .betting_strata import _pack, _unpack, check_bet_tuning
from .bounds import ControlVariateCS

CALIBRATION_PSEUDO_DRAWS = 5.0
TRUST_START = 0.5  # ρ before the history has been measured on any draw (the default of ``trust_start``)


@dataclass(frozen=True)
class DrawLaw:
    """The draw law (module docstring): Neyman on the predicted residual spread, its variance floored at
    ``variance_floor`` (also the floor of the bets' predicted variance), mixed with draws ∝ weight whose share
    decays from 1 to ``uniform_mix`` over ``warmup`` scored items. Checked when the method starts."""

    uniform_mix: float = 0.3
    warmup: int = 50
    variance_floor: float = 0.01


DEFAULT_DRAW_LAW = DrawLaw()


def trust_from_sums(sdd: float, sdy: float, syy: float, dof: int, level: float) -> float:
    """ρ from an out-of-sample least-squares fit of y on d through the origin, given ``Σd²``, ``Σdy``, ``Σy²`` and
    the residuals' degrees of freedom: 0 unless the one-sided t-test of "slope ≤ 0" rejects at ``level`` (slope
    ρ̂ = Σdy/Σd², standard error s), then ``min(ρ̂, 1)·(1 − s²/ρ̂²)`` (positive-part James–Stein towards no
    history, Efron & Morris 1973)."""
    if sdd <= 0.0 or dof < 1:
        return 0.0
    slope = sdy / sdd
    if slope <= 0.0:
        return 0.0
    from scipy.stats import t as student_t

    se2 = max(syy - sdy * slope, 0.0) / dof / sdd
    if slope <= float(student_t.ppf(1.0 - level, dof)) * math.sqrt(se2):
        return 0.0
    return min(slope, 1.0) * max(0.0, 1.0 - se2 / slope**2)


@register
class HistoryMethod(DrawLogReplay, BankMethod):
    """Control-variate betting confidence sequence with history predictions (see module docstring)."""

    name = "history"
    anytime_valid = True
    # the level of the test that history predicts something before it is trusted at all (measured_trust)
    TRUST_TEST_LEVEL = 0.05
    guarantee_text = ("anytime-valid and exact: one without-replacement betting confidence sequence "
                      "(Waudby-Smith & Ramdas 2020) on score − history prediction, with known draw "
                      "probabilities; valid whatever the history is")

    option_groups: ClassVar[dict[str, type]] = {"draw_law": DrawLaw}

    def __init__(self, confidence: float = 0.95, target: str = "bank", grid_size: int = 4097,
                 draw_law: DrawLaw = DEFAULT_DRAW_LAW, subset_intervals: bool = True,
                 bet_halfwidth: float | None = None, bet_horizon: int | None = None,
                 trust_start: float = TRUST_START) -> None:
        super().__init__(confidence=confidence, target=target)
        self.trust_start = trust_start
        self.bet_halfwidth = bet_halfwidth
        self.bet_horizon = bet_horizon
        self.grid_size = grid_size
        self.draw_law = draw_law
        self.subset_intervals = subset_intervals

    def _validate_params(self) -> None:
        super()._validate_params()
        if self.target != "bank":
            raise InputError(f"method 'history' answers the bank's question: target must be 'bank', "
                             f"got target={self.target!r}")
        check_positive_int(self.grid_size, "grid_size", minimum=65)
        law = self.draw_law
        check_in_range(law.uniform_mix, "uniform_mix", 0.0, 1.0)
        if not law.uniform_mix > 0.0:  # every item must keep a positive draw probability
            raise InputError(f"uniform_mix must lie in (0, 1], got {law.uniform_mix!r}")
        check_in_range(law.variance_floor, "variance_floor", 0.0, 0.25, closed=False)
        check_bet_tuning(self.bet_halfwidth, self.bet_horizon)
        check_in_range(self.trust_start, "trust_start", 0.0, 1.0)
        if isinstance(law.warmup, bool) or not isinstance(law.warmup, (int, np.integer)) or law.warmup < 0:
            raise InputError(f"warmup must be a non-negative integer (items), got {law.warmup!r}")

    # -- start ----------------------------------------------------------------------
    def _start_extra(self) -> None:
        spec = self.bank_
        if spec.history is None:
            raise InputError("method 'history' needs history: other models' recorded scores on these items "
                             "(--history); without it use 'adaptive'")
        self.prior_ = spec.history
        self.w_ = spec.weights()
        masks = [np.ones(spec.n_items, dtype=bool)]
        self.group_subset_ = [-1]
        # per-subset intervals cost one more confidence sequence each; the estimand's needs none of them
        if spec.subsets is not None and spec.mean_of_means and self.subset_intervals:
            codes = spec.subset_codes()
            for s in np.unique(codes):
                masks.append(codes == s)
                self.group_subset_.append(int(s))
        self.group_mask_ = np.vstack(masks)
        # the no-history prediction's cells: sub-datasets where the bank has them (``uniform``'s controls)
        self.z_cells_ = spec.subset_codes()
        self.group_weight_ = self.group_mask_ @ self.w_
        # the estimand's CS bets for the goal's half-width; per-subset intervals keep the all-times plug-in
        self.cs_ = [ControlVariateCS(self.delta, int(self.grid_size),
                                     bet_halfwidth=self.bet_halfwidth if g == 0 else None,
                                     bet_horizon=self.bet_horizon if g == 0 else None, population=spec.n_items)
                    for g in range(len(masks))]
        n_groups = len(masks)
        # the draw log, in the order items leave the population; outside (undrawn) items have batch −1
        self.log_items_ = np.zeros(0, dtype=np.int64)
        self.log_a_ = np.zeros(0)
        self.log_h_ = np.zeros(0)  # the history's and the no-history prediction at draw time (for the trust)
        self.log_z_ = np.zeros(0)
        self.log_s_ = np.zeros(0)
        self.log_total_ = np.zeros(0)
        self.log_batch_ = np.zeros(0, dtype=np.int64)
        self.in_log_ = np.zeros(spec.n_items, dtype=bool)
        # per batch and group, fixed at the batch's draw time: Σ_R w a, max w a/s, max w (1−a)/s, Σ w² σ² κ / s
        self.batch_stats_ = np.zeros((0, 4, n_groups))
        self._reset_progress()
        self._pred_cache: tuple[tuple[int, float | None], tuple] | None = None
        self.trust_override_: float | None = None  # ρ fixed by a caller (see :meth:`share_trust`)

    def _reset_progress(self) -> None:
        n_groups = self.group_mask_.shape[0]
        self.processed_ = 0
        self.done_w_ = np.zeros(n_groups)  # Σ w over processed log entries, per group
        self.known_ = np.zeros(n_groups)  # Σ w x over processed log entries, per group
        self.carry_batch_ = -1  # batch of the last processed draw and Σ w a of its processed draws, per group
        self.carry_a_ = np.zeros(n_groups)
        self.resid_sq_ = 0.0  # calibration: Σ (x − a)² and Σ predicted σ² over processed draws
        self.pred_var_ = 0.0
        self.n_draws_done_ = 0

    # -- predictions ------------------------------------------------------------------
    def predictions(self) -> np.ndarray:
        """Current control variate of every item: ``z + ρ (h − z)`` (see :meth:`_prediction_parts`)."""
        return self._prediction_parts()[0]

    def _prediction_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(control variate, history prediction h, no-history prediction z) per item, fixed by the scores so far.

        ``h`` is the history refitted on the model's scores; ``z`` the running mean of its scores in the item's
        sub-dataset (shrunk to ½ by one pseudo-item), what a run without history predicts (``uniform``'s controls). The control variate ``z + ρ (h − z)`` trusts
        the history by ``ρ`` = :meth:`history_trust`, measured on draws the predictions had not seen, so useless
        history falls back to ``z`` (with draws ∝ w, Y is then the score itself: the run without history).
        """
        key = (int(self.order_.size), self.trust_override_)
        if self._pred_cache is None or self._pred_cache[0] != key:
            seen = np.flatnonzero(self.scored_)  # bank order: the fit never depends on arrival order
            h = self._predict(seen)
            cells = self.z_cells_[seen]
            z = ((0.5 + np.bincount(cells, self.scores_[seen], minlength=self.z_cells_.max() + 1))
                 / (1.0 + np.bincount(cells, minlength=self.z_cells_.max() + 1)))[self.z_cells_]
            rho = self.history_trust(h, z)
            self._pred_cache = (key, (np.clip(z + rho * (h - z), 0.0, 1.0), h, z))
        return self._pred_cache[1]

    def share_trust(self, rho: float | None) -> None:
        """Use ``rho`` as ρ from now on (None: measure it again, :meth:`measured_trust`).

        For a caller that keeps several methods' control variates linked (compare --history: the pair's and both
        models', so the models' point estimates differ by the pair's). ``rho`` must be fixed by scores seen before
        this method's next draws, which keeps every control variate predictable.
        """
        if rho is not None:
            check_in_range(rho, "rho", 0.0, 1.0)
        self.trust_override_ = None if rho is None else float(rho)

    def history_trust(self, h: np.ndarray, z: np.ndarray) -> float:
        """ρ of the control variate: the one set by :meth:`share_trust`, else :meth:`measured_trust`."""
        if self.trust_override_ is not None:
            return self.trust_override_
        return self.measured_trust()

    def measured_trust(self) -> float:
        """ρ ∈ [0, 1]: how far the control variate follows the history, from what it has shown it predicts.

        Over the processed draws, with the predictions each was drawn under (out of sample: a draw's predictions
        were fixed before its score), the least-squares slope of ``x − z`` on ``h − z`` is ρ̂ with standard error
        s. ρ is 0 unless the one-sided t-test of "the history predicts nothing" (slope ≤ 0) rejects at level
        :attr:`TRUST_TEST_LEVEL` (ρ̂/s above Student's t quantile with n − 1 degrees of freedom), so useless
        history is ignored outright at most looks instead of being followed by a noise-sized ρ; past the test,
        ρ = min(ρ̂, 1)·(1 − s²/ρ̂²) (James–Stein shrinkage towards no history). ``trust_start`` before two draws.
        It uses only scores already seen, so the control variate, and every draw probability, stays predictable.
        """
        done = slice(0, self.processed_)
        hd, zd = self.log_h_[done], self.log_z_[done]
        ok = np.isfinite(hd) & np.isfinite(zd)
        d = hd[ok] - zd[ok]
        dd = float(d @ d)
        if d.size < 2 or dd <= 0.0:
            return float(self.trust_start)
        y = self.scores_[self.log_items_[done][ok]] - zd[ok]
        return trust_from_sums(dd, float(y @ d), float(y @ y), d.size - 1, self.TRUST_TEST_LEVEL)

    def _predict(self, seen: np.ndarray) -> np.ndarray:
        return self.prior_.predict(seen, self.scores_[seen])

    def _sigma2(self, a: np.ndarray) -> np.ndarray:
        return np.maximum(a * (1.0 - a), float(self.draw_law.variance_floor))

    def _calibration(self) -> float:
        pseudo = CALIBRATION_PSEUDO_DRAWS
        mean_pred = self.pred_var_ / self.n_draws_done_ if self.n_draws_done_ else 0.25
        return (pseudo * mean_pred + self.resid_sq_) / (pseudo * mean_pred + self.pred_var_)

    # -- draws ------------------------------------------------------------------------
    def _choose(self, k: int, rng: np.random.Generator):
        avail = self.available()
        redo = avail[self.in_log_[avail]][:k]  # released draws: their scores are still owed to the log
        need = k - redo.size
        undrawn = np.flatnonzero(~self.in_log_)
        if need <= 0 or undrawn.size == 0:
            return redo, np.ones(redo.size)
        a = self.predictions()
        s = self._sampling_scores(a[undrawn], self.w_[undrawn])
        keys = rng.exponential(size=undrawn.size) / s  # successive sampling ∝ s without replacement
        pick = np.argsort(keys, kind="stable")[:need]
        probs = self._log_batch(undrawn, pick, a, s)
        return np.concatenate([redo, undrawn[pick]]), np.concatenate([np.ones(redo.size), probs])

    def _sampling_scores(self, a_r: np.ndarray, w_r: np.ndarray) -> np.ndarray:
        """Draw weights over the undrawn items: Neyman on the predicted residual spread mixed with ∝ w, when that is
        predicted to give the narrower interval (:meth:`ControlVariateCS.predicted_width`); else ∝ w.

        Neyman draws lower Y's variance, but their importance weights widen its range, and the truncated bets pay
        for the range whenever they are large (short horizons, wide goals). The choice uses predictions,
        calibration and counts fixed before the batch, so every draw probability stays known (predictable).
        """
        mix = self._mix()
        if mix >= 1.0:
            return w_r
        sig = np.sqrt(self._sigma2(a_r))
        active = w_r * ((1.0 - mix) * sig / (float(w_r @ sig) / float(w_r.sum())) + mix)
        cs, u = self.cs_[0], float(w_r.sum())
        i, alpha = float((self.log_batch_ >= 0).sum() + 1), float(self.group_weight_[0]) / u
        kappa = self._calibration()

        def moments(s: np.ndarray) -> tuple[float, tuple[float, float]]:
            scale = float(s.sum()) / u  # Y's variance and how far it can fall and rise (ν at the prediction)
            var = scale / u * float(np.sum(w_r**2 * self._sigma2(a_r) / s)) * kappa
            return var, (scale * float(np.max(w_r * a_r / s)), scale * float(np.max(w_r * (1.0 - a_r) / s)))

        return active if cs.narrowest_law(i, alpha, [moments(w_r), moments(active)]) == 1 else w_r

    def _mix(self) -> float:
        """The weight-proportional share of the draws: all of them at first, ``uniform_mix`` in the long run.

        Importance weights widen the range of Y, which caps the early bets; they pay off once the model's
        own scores have sharpened the predictions. With ``warmup`` = n₀ the share is
        ``η + (1 − η) n₀/(n₀ + n)`` after n scored items (predictable: n is known before the batch).
        """
        n0 = float(self.draw_law.warmup)
        eta = float(self.draw_law.uniform_mix)
        return eta + (1.0 - eta) * n0 / (n0 + self.n_scored) if n0 > 0 else eta

    def _log_batch(self, undrawn: np.ndarray, pick: np.ndarray, a: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Log draws ``undrawn[pick]`` (in that order, successive sampling ∝ ``s``); their draw probabilities."""
        a_r, w_r = a[undrawn], self.w_[undrawn]
        drawn, s_drawn = undrawn[pick], s[pick]
        totals = float(s.sum()) - np.concatenate([[0.0], np.cumsum(s_drawn)[:-1]])
        totals = np.maximum(totals, s_drawn)
        gm = self.group_mask_[:, undrawn]
        stats = np.stack([
            gm @ (w_r * a_r),
            np.where(gm, w_r * a_r / s, 0.0).max(axis=1),
            np.where(gm, w_r * (1.0 - a_r) / s, 0.0).max(axis=1),
            gm @ (w_r**2 * self._sigma2(a_r) / s) * self._calibration(),
        ])
        _, h, z = self._prediction_parts()
        self._log(drawn, a[drawn], s_drawn, totals, self.batch_stats_.shape[0], h[drawn], z[drawn])
        self.batch_stats_ = np.concatenate([self.batch_stats_, stats[None]], axis=0)
        return s_drawn / totals

    def propose_shared_order(self, items: Any) -> None:
        """Take ``items`` as the next draws, made ∝ weight without replacement by the caller.

        For runs whose item order is fixed in advance (a shared order drawn ∝ the estimand's weights before any
        score, as in paired runs): each draw then has probability ``w_j / (undrawn weight)``, which is what the
        log records, so the martingale is the same as for the method's own draws.
        """
        items = np.asarray(items, dtype=np.int64)
        if items.size == 0:
            return
        if self.in_log_[items].any() or np.unique(items).size != items.size:
            raise InputError("propose_shared_order: items must be distinct and not drawn before")
        undrawn = np.flatnonzero(~self.in_log_)
        where = np.searchsorted(undrawn, items)
        self._log_batch(undrawn, where, self.predictions(), self.w_[undrawn])
        self.pending_[items] = True
        rank = self._proposed_rank()
        rank[items] = self._next_rank + np.arange(items.size)
        self._next_rank += items.size

    def _log(self, items, a, s, totals, batch, h=None, z=None) -> None:
        nan = np.full(len(items), np.nan)
        self.log_items_ = np.concatenate([self.log_items_, items])
        self.log_a_ = np.concatenate([self.log_a_, a])
        self.log_h_ = np.concatenate([self.log_h_, nan if h is None else h])
        self.log_z_ = np.concatenate([self.log_z_, nan if z is None else z])
        self.log_s_ = np.concatenate([self.log_s_, s])
        self.log_total_ = np.concatenate([self.log_total_, totals])
        self.log_batch_ = np.concatenate([self.log_batch_, np.full(len(items), batch, dtype=np.int64)])
        self.in_log_[items] = True

    # -- updates ------------------------------------------------------------------------
    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        if self._replaying:
            return
        outside = items[~self.in_log_[items]]
        if outside.size:  # scored without being drawn here: they leave the population as known items
            nan = np.full(outside.size, np.nan)
            self._log(outside, nan, nan, nan, -1)
        self._advance()

    def _advance(self) -> None:
        """Feed the martingales every logged entry whose predecessors are all scored, in log order."""
        start = self.processed_
        ready = self.scored_[self.log_items_[start:]]
        stop = start + (int(np.argmin(ready)) if not ready.all() else ready.size)
        if stop == start:
            return
        idx = self.log_items_[start:stop]
        x, w = self.scores_[idx], self.w_[idx]
        a, s, tot, batch = (arr[start:stop] for arr in (self.log_a_, self.log_s_, self.log_total_, self.log_batch_))
        draw = batch >= 0
        b = np.where(draw, batch, 0)
        stats = self.batch_stats_[b] if self.batch_stats_.shape[0] else np.zeros((idx.size, 4, len(self.cs_)))
        # segments of consecutive entries of one batch; the first may continue the batch processed last time
        continuing = bool(batch[0] == self.carry_batch_)
        starts = np.concatenate([[True], batch[1:] != batch[:-1]])
        seg_id = np.cumsum(starts) - 1
        seg_first = np.flatnonzero(starts)
        a_safe = np.nan_to_num(a)
        for g, cs in enumerate(self.cs_):
            in_g = self.group_mask_[g, idx]
            wg = np.where(in_g, w, 0.0)
            done_before = self.done_w_[g] + np.cumsum(wg) - wg
            known_before = self.known_[g] + np.cumsum(wg * x) - wg * x
            # Σ w a of the earlier draws of the same batch (in this group): the batch's A minus those
            contrib = np.where(draw, wg * a_safe, 0.0)
            csum = np.cumsum(contrib) - contrib
            drawn_a = csum - csum[seg_first][seg_id]
            if continuing:
                drawn_a = drawn_a + np.where(seg_id == 0, self.carry_a_[g], 0.0)
            u = self.group_weight_[g] - done_before
            ok = draw & (u > 1e-12)
            if ok.any():
                u_ok = u[ok]
                base = (stats[ok, 0, g] - drawn_a[ok]) / u_ok
                scale = tot[ok] / u_ok
                ratio = np.where(in_g[ok], w[ok] / s[ok], 0.0) * scale
                y = base + ratio * (x[ok] - a[ok])
                cs.observe_many(
                    y, base - scale * stats[ok, 1, g], base + scale * stats[ok, 2, g],
                    np.full(y.size, self.group_weight_[g]) / u_ok, -known_before[ok] / u_ok,
                    tot[ok] / u_ok**2 * stats[ok, 3, g],
                )
            self.done_w_[g] += wg.sum()
            self.known_[g] += float(wg @ x)
            last_seg = seg_id == seg_id[-1]
            tail = float(contrib[last_seg].sum())
            carried = self.carry_a_[g] if (continuing and seg_id[-1] == 0) else 0.0
            self.carry_a_[g] = carried + tail
        self.carry_batch_ = int(batch[-1])
        self.resid_sq_ += float(np.sum((x[draw] - a[draw]) ** 2))
        self.pred_var_ += float(np.sum(self._sigma2(a[draw])))
        self.n_draws_done_ += int(draw.sum())
        self.processed_ = stop

    # -- results ------------------------------------------------------------------------
    def _group_bounds(self, g: int) -> tuple[float, float]:
        mask = self.group_mask_[g]
        w = self.w_[mask]
        sc = self.scored_[mask]
        known = float(w[sc] @ self.scores_[mask][sc])
        wg = float(self.group_weight_[g])
        return known / wg, (known + float(w[~sc].sum())) / wg

    def _group_point(self, g: int, a: np.ndarray) -> float:
        mask = self.group_mask_[g]
        filled = np.where(self.scored_, self.scores_, a)[mask]
        return float(self.w_[mask] @ filled) / float(self.group_weight_[g])

    def _group_interval(self, g: int) -> tuple[float, float]:
        return self.cs_[g].interval(*self._group_bounds(g))

    def result(self) -> Estimate:
        self._check_started()
        if self.n_scored == 0:
            return self._empty_estimate(self.guarantee_text)
        a = self.predictions()
        lo, hi = self._group_interval(0)
        point = min(max(self._group_point(0, a), lo), hi)
        subsets: tuple[SubsetEstimate, ...] = ()
        if len(self.cs_) > 1:
            names = self.bank_.names()
            out = []
            for g in range(1, len(self.cs_)):
                s_lo, s_hi = self._group_interval(g)
                mask = self.group_mask_[g]
                seen = int(self.scored_[mask].sum())
                out.append(SubsetEstimate(
                    subset=names[self.group_subset_[g]],
                    mean=min(max(self._group_point(g, a), s_lo), s_hi) if seen else float("nan"),
                    lower=s_lo, upper=s_hi, n_scored=seen, n_total=int(mask.sum()),
                    weight=float(self.group_weight_[g]),
                ))
            subsets = tuple(out)
        return Estimate(
            method=self.name, mean=point, lower=lo, upper=hi, n_scored=self.n_scored,
            confidence=float(self.confidence), anytime_valid=True, target=self.target,
            n_total=self.bank_.n_items, guarantee=self.guarantee_text, exhausted=self.exhausted,
            subsets=subsets, extra=self._result_extra(),
        )

    def _result_extra(self) -> tuple[tuple[str, Any], ...]:
        info = self.prior_.describe()
        return (("history_models", info["n_models"]), ("history_items_matched", info["items_matched"]),
                ("history_factors", info["n_factors"]), ("calibration", round(self._calibration(), 4)))

    # -- persistence ----------------------------------------------------------------------
    def _state_extra(self) -> dict[str, Any]:
        def floats(arr):
            return [None if not np.isfinite(v) else float(v) for v in arr]

        return {"log_items": self.log_items_.tolist(), "log_a": floats(self.log_a_), "log_s": floats(self.log_s_),
                "log_h": floats(self.log_h_), "log_z": floats(self.log_z_),
                "log_total": floats(self.log_total_), "log_batch": self.log_batch_.tolist(),
                "batch_stats": self.batch_stats_.tolist(),
                "rejected": [_pack(cs.rejected) for cs in self.cs_]}

    def _load_extra(self, extra: dict[str, Any]) -> None:
        items = np.asarray(extra.get("log_items", []), dtype=np.int64)
        if items.size and (items.min() < 0 or items.max() >= self.bank_.n_items or np.unique(items).size != items.size):
            raise InputError("state's draw log names items outside the bank or the same item twice")

        def col(key):
            arr = np.asarray([np.nan if v is None else v for v in extra.get(key, [])], dtype=float)
            if arr.size != items.size:
                raise InputError(f"state's draw log is damaged: {key!r} has {arr.size} entries, expected {items.size}")
            return arr

        a, s, tot = col("log_a"), col("log_s"), col("log_total")
        # states written before the trust was measured have no draw-time predictions: those draws do not count
        h, z = ((col(key) if key in extra else np.full(items.size, np.nan)) for key in ("log_h", "log_z"))
        batch = np.asarray(extra.get("log_batch", []), dtype=np.int64)
        stats = np.asarray(extra.get("batch_stats", []), dtype=float)
        n_groups = len(self.cs_)
        stats = stats.reshape((-1, 4, n_groups)) if stats.size else np.zeros((0, 4, n_groups))
        if batch.size != items.size or (batch.size and batch.max() >= stats.shape[0]):
            raise InputError("state's draw log is damaged: batch numbers do not match its batch statistics")
        self.batch_stats_ = stats
        self._log(items, a, s, tot, 0, h, z)
        self.log_batch_ = batch
        outside = self.order_[~self.in_log_[self.order_]]
        if outside.size:
            nan = np.full(outside.size, np.nan)
            self._log(outside, nan, nan, nan, -1)
        self._reset_progress()
        self._advance()
        for cs, text in zip(self.cs_, extra.get("rejected") or []):
            cs.rejected |= _unpack(text, cs.grid.size)
