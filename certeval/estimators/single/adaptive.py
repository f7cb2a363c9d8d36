"""``adaptive``: certeval's default — an anytime-valid, variance-adaptive interval for the bank's mean.

Construction
------------
1. **Strata, fixed before any score.** ``strata='subsets'``: one stratum per
   sub-dataset when the estimand is the mean-of-means (Arviv et al. 2026, eq. 1), else the
   whole bank. ``strata='features'``: each of those is refined by k-means on the
   item features alone (:func:`~certeval.estimators.single.strata.feature_strata`:
   at most ``max_clusters`` clusters of ≥ ``min_stratum_size`` items,
   seeded by ``seed``) — Cer-Eval's idea of sampling more where the loss
   varies (Wang et al. 2025, arXiv:2505.03814 §5), but with a partition that never looks at a score, so it
   is a deterministic function of the bank and every martingale below stays
   valid (Cer-Eval's Alg. 2 re-fits on scores). ``strata='auto'`` (default)
   uses feature strata when the bank has features, ``target='bank'``, no
   sub-datasets (mean-of-means estimand) and is large enough to split
   (≥ 2·``min_stratum_size`` items); else sub-dataset strata. On banks with
   sub-datasets ``strata='features'`` must be asked for: it scores fewer items
   (docs/results_single.md) but its per-subset intervals are each valid on
   their own, not simultaneously with the overall one.
   Items inside a stratum carry equal weight: the estimand is ``Σ_h W_h μ_h``.
2. **Combination across strata** (``combine``).

   * ``'union'`` — each stratum mean ``μ_h`` gets the hedged without-replacement
     betting CS of Waudby-Smith & Ramdas, "Confidence sequences for sampling
     without replacement" (NeurIPS 2020, §3) at δ/H, items drawn uniformly
     without replacement inside the stratum; ``[Σ W_h lo_h, Σ W_h hi_h]`` holds
     by the union bound, and so do the per-subset intervals, simultaneously.
     The cost grows with H (``ln(2H/δ)`` and a sum of radii instead of a
     root-sum-of-squares). ``target='distribution'`` uses the i.i.d. capital
     (WSR, JRSS-B 2024).
   * ``'joint'`` (``target='bank'``) — ONE betting confidence sequence for the
     estimand itself, on a stratified control-variate statistic, so there is no
     union bound and no nuisance vector. Draw i picks stratum h with a
     predictable probability ``q_h`` and then an undrawn item of h uniformly;
     with ``U_h`` the stratum's undrawn weight, ``U = Σ U_h``, ``K`` the weighted
     sum of the scores already drawn and ``a_h`` a predictable guess of stratum
     h's mean (its shrunk running mean),

        ``Y_i = Σ_g (U_g/U) a_g + (U_h/U)/q_h · (X_i − a_h)``,
        ``E[Y_i | past] = Σ_h (U_h/U) μ_h^rem = (m − K)/U =: ν_i(m)``

     exactly (importance weighting: ``E[(U_h/U)/q_h (X − a_h)] = Σ_h (U_h/U)(μ_h^rem − a_h)``).
     ``ν_i`` is affine and increasing in the estimand m, as WSR's
     ``μ_i^WoR(m)``; ``Y_i`` lies in a known range (over the strata h could be).
     The hedged capital ``½∏(1 + λ⁺_i(Y_i − ν_i(m))) + ½∏(1 − λ⁻_i(Y_i − ν_i(m)))``
     is a nonnegative martingale under the true m, and Ville's inequality gives
     the CS (:class:`ControlVariateCS`). With ``a_h ≈ μ_h`` the variance of
     ``Y`` is ``≈ Σ_h (U_h/U)² σ_h² / q_h``: the stratified variance (the
     between-strata part is gone), minimised by Neyman's ``q_h ∝ U_h σ_h``. The
     bets use that predictable variance (:func:`~.bounds.bet_sizes`: tuned to
     the goal's half-width or item budget, else WSR's all-times plug-in),
     truncated so every factor stays positive. Per-subset intervals: the same
     construction restricted to the subset's strata; each holds with
     probability ≥ 1 − δ on its own, not simultaneously with the overall one.
     (A product of per-stratum e-processes projected onto ``Σ W_h μ_h`` was
     2× wider than the unstratified CS on S2, and dropped.)

   ``combine='auto'`` (default) is ``'joint'`` whenever ``target='bank'`` and
   there are several strata (feature or sub-dataset strata): measured on the
   bundled banks with sub-datasets, ``'union'`` needed 2–3× the items, the
   price of ``ln(2H/δ)`` per stratum and of adding radii instead of variances.
   One stratum, or ``target='distribution'``, is ``'union'`` (WSR's own CS). All
   intervals are intersected with the deterministic bounds of the bank, so the
   width is exactly 0 once every item is scored.
3. **Allocation (Cer-Eval's idea, Wang et al. 2025 Alg. 1 line 18: more items where the
   loss varies).** ``'joint'``: draws follow ``q_h = 0.9 · U_h σ̂_h / Σ U_g σ̂_g +
   0.1 · U_h / U`` (Neyman on the undrawn weight, mixed with proportional so
   every ``q_h > 0`` and ``Y`` stays bounded), ``σ̂_h²`` the stratum's running
   variance shrunk towards ¼ — the allocation the greedy rule "largest
   reduction of ``Σ W_h² σ_h²/n_h``" converges to, randomised because the
   importance weights need a known draw probability — used for a draw only when it
   is predicted to give a narrower interval than proportional draws (its importance
   weights widen Y's range, which large truncated bets pay for; see
   ``ControlVariateCS.narrowest_law``), else ``q_h = U_h / U``. ``'union'``: a batch of k
   is allocated greedily, one slot at a time, to the stratum with the largest
   reduction of ``W_h r_h(n_h)`` (``r_h`` an empirical-Bernstein proxy radius at
   δ/H). Either way only past scores are used (predictable); the draw log
   (items, ``q``, ``a``, ``σ̂²`` at draw time) is kept in the state, and a
   draw whose score is lost is proposed again first.

Guarantee
---------
P(∃ t: Σ_i w_i x_i ∉ [lower_t, upper_t]) ≤ δ for the bank's estimand, at every
look, under any data-dependent stopping rule. Feature strata require
``target='bank'`` (their weights are the bank's own cluster proportions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from certeval.errors import InputError

from ..protocol import register
from ..results import Estimate, SubsetEstimate
from ..validation import check_choice, check_in_range, check_positive_int
from .betting_strata import BettingStrataMethod, _pack, _unpack
from .bounds import ControlVariateCS
from .strata import DrawRows, combine_strata, feature_strata, joint_statistic, stratified_moments

STRATA_MODES, COMBINE_MODES = ("auto", "subsets", "features"), ("auto", "union", "joint")


@dataclass(frozen=True)
class Stratification:
    """How the bank is cut into strata before any score (step 1 of the module docstring): ``strata`` is ``auto``,
    ``subsets`` or ``features``; feature strata are k-means on the item features, at most ``max_clusters`` clusters
    of ≥ ``min_stratum_size`` items, seeded by ``seed``. Checked when the method starts."""

    strata: str = "auto"
    max_clusters: int = 4
    min_stratum_size: int = 50
    seed: int = 0


DEFAULT_STRATIFICATION = Stratification()


class DrawLogReplay:
    """Mixin for methods that keep a draw log (items with their draw probabilities) in their state: on
    ``from_state`` the scores are replayed without logging them as undrawn items; ``_load_extra`` then
    restores the log and feeds the martingales in draw order."""

    _replaying = False

    def _replay(self, order: np.ndarray, scores: np.ndarray, looks: int) -> None:
        self._replaying = True
        try:
            super()._replay(order, scores, looks)  # type: ignore[misc]
        finally:
            self._replaying = False


@register
class AdaptiveMethod(DrawLogReplay, BettingStrataMethod):
    """Stratified without-replacement betting CS with variance-adaptive allocation (see module docstring)."""

    name = "adaptive"
    option_groups: ClassVar[dict[str, type]] = {"stratification": Stratification}

    def __init__(self, confidence: float = 0.95, target: str = "bank", grid_size: int = 4097,
                 stratification: Stratification = DEFAULT_STRATIFICATION, combine: str = "auto",
                 uniform_mix: float = 0.1, bet_halfwidth: float | None = None, bet_horizon: int | None = None) -> None:
        super().__init__(confidence=confidence, target=target, grid_size=grid_size, bet_halfwidth=bet_halfwidth,
                         bet_horizon=bet_horizon)
        self.stratification = stratification
        self.combine = combine
        self.uniform_mix = uniform_mix

    def _validate_params(self) -> None:
        super()._validate_params()
        s = self.stratification
        check_choice(s.strata, "strata", STRATA_MODES)
        check_choice(self.combine, "combine", COMBINE_MODES)
        check_positive_int(s.max_clusters, "max_clusters", minimum=1)
        check_positive_int(s.min_stratum_size, "min_stratum_size", minimum=2)
        if isinstance(s.seed, bool) or not isinstance(s.seed, (int, np.integer)) or s.seed < 0:
            raise InputError(f"seed (k-means random_state) must be a non-negative integer, got {s.seed!r}")
        check_in_range(self.uniform_mix, "uniform_mix", 0.0, 1.0, closed=False)
        if self.combine == "joint" and self.target != "bank":
            raise InputError(f"adaptive combine='joint' needs target='bank', got target={self.target!r}")

    @property
    def guarantee_text(self) -> str:  # type: ignore[override]
        if getattr(self, "combine_", "union") == "joint":
            return ("anytime-valid: one without-replacement betting confidence sequence (Waudby-Smith & Ramdas "
                    "2020) on a stratified control-variate statistic; per-subset intervals each valid on their own")
        return ("anytime-valid: per-stratum without-replacement betting confidence sequences "
                "(Waudby-Smith & Ramdas 2020) at δ/H, union bound")

    # -- strata ------------------------------------------------------------------
    def _make_strata(self, base: np.ndarray) -> np.ndarray:
        spec, s = self.bank_, self.stratification
        self.strata_mode_ = "subsets"
        if s.strata == "features":
            if spec.features is None:
                raise InputError("adaptive strata='features' needs item features (embeddings); the bank has none")
            if self.target != "bank":
                raise InputError(f"adaptive strata='features' needs target='bank' (cluster weights are the "
                                 f"bank's own proportions), got target={self.target!r}")
        elif (s.strata == "subsets" or spec.features is None or self.target != "bank"
              or (spec.subsets is not None and spec.mean_of_means)):
            # auto keeps sub-dataset strata on banks with sub-datasets (the strata of the estimand itself)
            return base
        codes = feature_strata(spec.features, base, s.max_clusters, s.min_stratum_size, s.seed)
        if s.strata == "features" or codes.max() > base.max():
            self.strata_mode_ = "features"
            return codes
        return base

    def _start_strata(self) -> None:
        # auto: one joint confidence sequence whenever the bank target has several strata (no union bound, no
        # log(H/δ) per stratum: 2–3× fewer items on banks with sub-datasets); one stratum is WSR's own CS
        joint = self.combine == "joint" or (self.combine == "auto" and self.target == "bank"
                                             and (self.strata_mode_ == "features" or self._live_strata.size > 1))
        self.combine_ = "joint" if joint else "union"
        if not joint:
            super()._start_strata()
            return
        # groups whose means get an interval: the estimand (all strata), then each sub-dataset
        self.groups_ = [np.ones(self.n_strata, dtype=bool)]
        self.group_subset_ = [-1]
        if self.bank_.subsets is not None and self.bank_.mean_of_means:
            for s in np.unique(self.stratum_subset_[self._live_strata]):
                self.groups_.append(self.stratum_subset_ == s)
                self.group_subset_.append(int(s))
        self.group_weight_ = np.array([self.stratum_weight_[g].sum() for g in self.groups_])
        # the estimand's CS bets for the goal's half-width; per-subset intervals keep the all-times plug-in
        self.cs_groups_ = [ControlVariateCS(self.delta, int(self.grid_size),
                                            bet_halfwidth=self.bet_halfwidth if i == 0 else None,
                                            bet_horizon=self.bet_horizon if i == 0 else None,
                                            population=self.bank_.n_items)
                           for i in range(len(self.groups_))]
        self.item_weight_in_stratum_ = self.stratum_weight_ / np.maximum(self.stratum_size_, 1)
        self.draw_rule_ = "narrowest"  # stored: a state's laws are recomputed with the rule that drew them
        # the draw log: every item leaves the population in this order; a draw carries its batch (whose controls
        # a, v were fixed at draw time, and whether the caller drew the batch uniformly) and its stratum law q
        self.log_items_ = np.zeros(0, dtype=np.int64)
        self.log_batch_ = np.zeros(0, dtype=np.int64)  # −1: scored from outside, not drawn
        self.log_q_ = np.zeros((0, self.n_strata))
        self.batch_a_ = np.zeros((0, self.n_strata))
        self.batch_v_ = np.zeros((0, self.n_strata))
        self.batch_shared_ = np.zeros(0, dtype=bool)
        self.in_log_ = np.zeros(self.bank_.n_items, dtype=bool)
        self.processed_ = 0
        self.known_ = np.zeros(self.n_strata)  # Σ w x over processed items, per stratum
        self.done_ = np.zeros(self.n_strata)  # processed items, per stratum
        self.left_ = self.stratum_size_.astype(float)  # items not yet in the log, per stratum
        self._replaying = False

    # -- the draw rule (predictable) -----------------------------------------------------------
    def _controls(self) -> tuple[np.ndarray, np.ndarray]:
        """Per stratum: control a_h (shrunk running mean) and predictable variance σ̂_h², from absorbed scores."""
        n = self.stratum_n_
        a = (0.5 + self.stratum_sum_) / (n + 1)
        var = (0.25 + np.maximum(self.stratum_sumsq_ - n * (self.stratum_sum_ / np.maximum(n, 1)) ** 2, 0.0)) / (n + 1)
        return a, var

    def _draw_probabilities(self, left: np.ndarray, var: np.ndarray, a: np.ndarray, i: int) -> np.ndarray:
        """Neyman allocation on the undrawn weight, q_h ∝ U_h σ̂_h, mixed with proportional U_h / U, where that is
        predicted to give the narrower interval for draw i (its importance weights widen Y's range, which large
        truncated bets pay for: :meth:`ControlVariateCS.narrowest_law`); else proportional. Zero where no item is
        undrawn. The one draw rule: proposals and a stored log's recomputed laws both come from it."""
        u = left * self.item_weight_in_stratum_
        if u.sum() <= 0:
            return np.zeros_like(u)
        prop = u / u.sum()
        neyman = u * np.sqrt(var)
        q = np.where(left > 0, (1.0 - self.uniform_mix) * neyman / neyman.sum() + self.uniform_mix * prop, 0.0)
        if self.draw_rule_ == "neyman":  # a run begun before the rule chose between laws keeps its own rule
            return q
        laws = [stratified_moments(law, prop, var, a) for law in (prop, q)]
        return q if self.cs_groups_[0].narrowest_law(i, float(self.group_weight_[0]) / u.sum(), laws) == 1 else prop

    def _choose(self, k: int, rng: np.random.Generator):
        # a released (lost) draw stays in the log: it is proposed again first, its score is still owed
        if self.combine_ == "union":
            return self._choose_union(k, rng)
        avail = self.available()
        redo = avail[self.in_log_[avail]]  # released draws: their scores are still owed to the log
        chosen = list(redo[:k])
        probs = [1.0] * len(chosen)
        fresh = avail[~self.in_log_[avail]]
        pool = {int(h): list(rng.permutation(fresh[self.strata_[fresh] == h])) for h in self._live_strata}
        a, var = self._controls()
        left = self.left_.copy()
        qs, items = [], []
        drawn_before = int((self.log_batch_ >= 0).sum())
        while len(chosen) < k:
            # zero where nothing is undrawn: all undrawn are proposable
            q = self._draw_probabilities(left, var, a, drawn_before + len(items) + 1)
            if q.sum() <= 0:
                break
            q = q / q.sum()
            h = int(rng.choice(self.n_strata, p=q))
            item = pool[h].pop()
            chosen.append(item)
            probs.append(q[h] / left[h])
            qs.append(q)
            items.append(item)
            left[h] -= 1
        if items:
            self._log_draws(np.asarray(items, dtype=np.int64), np.vstack(qs), a, var)
        return np.asarray(chosen, dtype=np.int64), np.asarray(probs, dtype=float)

    def propose_shared_order(self, items: Any) -> None:
        """Log ``items`` as draws made ∝ weight without replacement by the caller (the shared order of a paired
        run, drawn before any score): draw i picks stratum h with probability ``U_h / U`` (undrawn weight), which
        is what the log records, so the martingale is the one of the method's own draws."""
        if getattr(self, "combine_", "union") != "joint":
            return
        items = np.asarray(items, dtype=np.int64).reshape(-1)
        if items.size == 0:
            return
        if self.in_log_[items].any() or np.unique(items).size != items.size:
            raise InputError("propose_shared_order: items must be distinct and not drawn before")
        onehot = np.zeros((items.size, self.n_strata))
        onehot[np.arange(items.size), self.strata_[items]] = 1.0
        u = (self.left_[None, :] - (np.cumsum(onehot, axis=0) - onehot)) * self.item_weight_in_stratum_
        a, var = self._controls()  # u: undrawn weight before each draw
        self._log_draws(items, u / u.sum(axis=1, keepdims=True), a, var, shared=True)

    def _log_draws(self, items: np.ndarray, q: np.ndarray | None, a: np.ndarray | None = None,
                   v: np.ndarray | None = None, shared: bool = False) -> None:
        """Append ``items`` to the log: one batch of draws with laws ``q`` (rows) and controls ``a``, ``v``, or
        (``q`` None) items scored from outside, which leave the population without feeding the martingale."""
        batch = -1
        if q is None:
            q = np.full((items.size, self.n_strata), np.nan)
        else:
            batch = self.batch_a_.shape[0]
            self.batch_a_ = np.vstack([self.batch_a_, a[None, :]])
            self.batch_v_ = np.vstack([self.batch_v_, v[None, :]])
            self.batch_shared_ = np.append(self.batch_shared_, shared)
        self.log_items_ = np.concatenate([self.log_items_, items])
        self.log_batch_ = np.concatenate([self.log_batch_, np.full(items.size, batch, dtype=np.int64)])
        self.log_q_ = np.vstack([self.log_q_, q])
        self.in_log_[items] = True
        np.subtract.at(self.left_, self.strata_[items], 1.0)

    def _recompute_laws(self, items: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """The stratum law q of every logged draw, from the log order and each batch's controls: the draw rule
        (:meth:`_draw_probabilities`) run again with the same arithmetic, so a stored state needs no per-draw rows."""
        left = self.stratum_size_.astype(float)
        rows = np.full((items.size, self.n_strata), np.nan)
        draws = 0
        for p, (j, b) in enumerate(zip(items, batch)):
            if b >= 0:
                draws += 1
                if self.batch_shared_[b]:  # the arithmetic of propose_shared_order, row by row
                    q = left * self.item_weight_in_stratum_
                    q = q / q.sum()
                else:
                    q = self._draw_probabilities(left, self.batch_v_[b], self.batch_a_[b], draws)
                    q = q / q.sum()
                rows[p] = q
            left[self.strata_[j]] -= 1.0
        return rows

    # -- updates -------------------------------------------------------------------
    def _absorb_stratum(self, h: int, scores: np.ndarray) -> None:
        if self.combine_ == "union":
            super()._absorb_stratum(h, scores)

    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        super()._absorb(items, scores)
        if self.combine_ != "joint" or self._replaying:
            return
        outside = items[~self.in_log_[items]]
        if outside.size:  # scored without being drawn here: they leave the population as known items
            self._log_draws(outside, None)
        self._advance()

    def _advance(self) -> None:
        """Feed the martingales every logged item whose predecessors are all scored, in log order: the ready run
        of the log at once, each group's CS with one vectorised call (same capital as one item at a time)."""
        start = self.processed_
        ready = self.scored_[self.log_items_[start:]]
        stop = start + (int(np.argmin(ready)) if not ready.all() else ready.size)
        if stop == start:
            return
        w_item = self.item_weight_in_stratum_
        items = self.log_items_[start:stop]
        strata, xs, batches = self.strata_[items], self.scores_[items], self.log_batch_[start:stop]
        # the undrawn weight U and known sums K before each entry: a short scalar walk (entries × 2 numbers)
        u_rows, k_rows = np.empty((items.size, self.n_strata)), np.empty((items.size, self.n_strata))
        for r, (h, x) in enumerate(zip(strata, xs)):
            u_rows[r] = (self.stratum_size_ - self.done_) * w_item
            k_rows[r] = self.known_
            self.known_[h] += w_item[h] * x
            self.done_[h] += 1
        self.processed_ = stop
        draws = batches >= 0  # an item scored from outside is no draw: it only leaves the population
        if draws.any():
            pos, b = np.arange(start, stop)[draws], batches[draws]
            rows = DrawRows(u_rows[draws], k_rows[draws], self.log_q_[pos], self.batch_a_[b], self.batch_v_[b],
                            strata[draws], xs[draws])
            for cs, g, wg in zip(self.cs_groups_, self.groups_, self.group_weight_):
                self._observe_group(cs, g, wg, rows)

    def _observe_group(self, cs, group, w_group, draws: DrawRows) -> None:
        """Feed group G's CS its draws' control-variate statistic (:func:`~.strata.joint_statistic`)."""
        observed = joint_statistic(group, w_group, draws)
        if observed is not None:
            cs.observe_many(*observed)

    # -- results ----------------------------------------------------------------------
    def _group_bounds(self, group: np.ndarray, w_group: float) -> tuple[float, float]:
        """Deterministic bounds of a group's mean from every scored item (unscored ones anywhere in [0, 1])."""
        mask = group[self.strata_]
        w = self.item_weights_[mask]
        sc = self.scored_[mask]
        known = float(w[sc] @ self.scores_[mask][sc])
        return known / w_group, (known + float(w[~sc].sum())) / w_group

    def _group_interval(self, i: int) -> tuple[float, float]:
        f_lo, f_hi = self._group_bounds(self.groups_[i], float(self.group_weight_[i]))
        return self.cs_groups_[i].interval(f_lo, f_hi)

    def result(self) -> Estimate:
        if getattr(self, "combine_", "union") == "union":
            return super().result()
        self._check_started()
        if self.n_scored == 0:
            return self._empty_estimate(self.guarantee_text)
        means = np.array([self._stratum_mean(h) for h in range(self.n_strata)])
        lows = self.stratum_sum_ / self.stratum_size_.clip(1)
        highs = (self.stratum_sum_ + self.stratum_size_ - self.stratum_n_) / self.stratum_size_.clip(1)
        point, _, _ = combine_strata(means, lows, highs, self.stratum_weight_)
        lo, hi = self._group_interval(0)
        subsets: tuple[SubsetEstimate, ...] = ()
        if len(self.groups_) > 1:
            names = self.bank_.names()
            out = []
            for i in range(1, len(self.groups_)):
                g, s = self.groups_[i], self.group_subset_[i]
                share = self.stratum_weight_ * g / self.group_weight_[i]
                p, _, _ = combine_strata(means, lows, highs, share)
                s_lo, s_hi = self._group_interval(i)
                seen = int(self.stratum_n_[g].sum())
                out.append(SubsetEstimate(
                    subset=names[s], mean=min(max(p, s_lo), s_hi) if seen else float("nan"), lower=s_lo,
                    upper=s_hi, n_scored=seen, n_total=int(self.stratum_size_[g].sum()),
                    weight=float(self.group_weight_[i]),
                ))
            subsets = tuple(out)
        return Estimate(
            method=self.name, mean=min(max(point, lo), hi), lower=lo, upper=hi, n_scored=self.n_scored,
            confidence=float(self.confidence), anytime_valid=True, target=self.target,
            n_total=self.bank_.n_items, guarantee=self.guarantee_text, exhausted=self.exhausted,
            subsets=subsets, extra=self._result_extra(),
        )

    def _result_extra(self) -> tuple[tuple[str, Any], ...]:
        return (("n_strata", int(self._live_strata.size)), ("strata", self.strata_mode_),
                ("combine", self.combine_))

    # -- persistence -------------------------------------------------------------------
    def _load_log(self, extra: dict[str, Any]) -> None:
        """The draw log of a stored state: batches with their controls (laws recomputed), or — states written
        before that — one row of (q, a, v) per draw, read as one batch per draw."""
        items = np.asarray(extra.get("log_items", []), dtype=np.int64)
        shape = (items.size, self.n_strata)
        self.draw_rule_ = extra.get("draw_rule", "neyman")
        if self.draw_rule_ not in ("neyman", "narrowest"):
            raise InputError(f"state's draw rule {self.draw_rule_!r} is not one this version knows")
        try:
            if "log_q" in extra:
                q, a, v = (np.asarray(extra.get(k, []), dtype=float).reshape(shape) for k in ("log_q", "log_a", "log_v"))
                for p in range(items.size):
                    self._log_draws(items[p:p + 1], q[p:p + 1], a[p], v[p])
                return
            batch = np.asarray(extra.get("log_batch", []), dtype=np.int64)
            self.batch_a_, self.batch_v_ = (np.asarray(extra.get(k, []), dtype=float).reshape(-1, self.n_strata)
                                            for k in ("batch_a", "batch_v"))
            self.batch_shared_ = np.asarray(extra.get("batch_shared", extra.get("batch_uniform", [])), dtype=bool)
        except ValueError as exc:
            raise InputError(f"state's draw log is damaged ({exc})") from None
        if "batch_shared" not in extra and self.batch_shared_.any() and np.ptp(self.item_weight_in_stratum_) > 0:
            raise InputError("state's shared order was drawn uniformly, before orders ∝ weight; start a new --run-id")
        n_batches = self.batch_a_.shape[0]
        if (batch.size != items.size or self.batch_v_.shape[0] != n_batches or self.batch_shared_.size != n_batches
                or (batch.size and (batch.min() < 0 or batch.max() >= n_batches))
                or (items.size and (items.min() < 0 or items.max() >= self.bank_.n_items))):
            raise InputError("state's draw log is damaged: items, batches and batch controls do not match")
        q = self._recompute_laws(items, batch)
        self.log_items_, self.log_batch_, self.log_q_ = items, batch, q
        self.in_log_[items] = True
        np.subtract.at(self.left_, self.strata_[items], 1.0)

    def _state_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"strata": self.strata_.tolist()} if self.strata_mode_ == "features" else {}
        if self.combine_ == "union":
            return {**super()._state_extra(), **extra}
        drawn = self.log_batch_ >= 0  # items scored from outside are re-logged from the scores on load
        return {**extra, "log_items": self.log_items_[drawn].tolist(), "log_batch": self.log_batch_[drawn].tolist(),
                "batch_a": self.batch_a_.tolist(), "batch_v": self.batch_v_.tolist(),
                "batch_shared": self.batch_shared_.astype(int).tolist(), "draw_rule": self.draw_rule_,
                "rejected": [_pack(cs.rejected) for cs in self.cs_groups_]}

    def _load_extra(self, extra: dict[str, Any]) -> None:
        if "strata" in extra and not np.array_equal(np.asarray(extra["strata"], dtype=np.int64), self.strata_):
            raise InputError("state's feature strata differ from those re-built from the bank's features "
                             "(different features, parameters or scikit-learn version)")
        if (self.combine_ == "union") != ("running" in extra or "log_items" not in extra):
            raise InputError(f"state of method {self.name!r} was written with the other way of combining strata "
                             f"(this version uses {self.combine_!r} here); resume it with the certeval that wrote "
                             "it, or start a new --run-id")
        if self.combine_ == "union":
            super()._load_extra({k: v for k, v in extra.items() if k != "strata"})
            return
        self._load_log(extra)
        outside = self.order_[~self.in_log_[self.order_]]
        if outside.size:
            self._log_draws(outside, None)
        self._advance()
        for cs, text in zip(self.cs_groups_, extra.get("rejected") or []):
            cs.rejected |= _unpack(text, cs.grid.size)
