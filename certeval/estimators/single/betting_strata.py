"""Per-stratum betting confidence sequences combined by the union bound (``combine='union'``).

Each stratum's mean gets the hedged without-replacement betting CS of Waudby-Smith & Ramdas (NeurIPS 2020,
§3; the i.i.d. capital of JRSS-B 2024 for ``target='distribution'``) at δ/H, and
``[Σ W_h lo_h, Σ W_h hi_h]`` holds by the union bound, with every per-stratum interval simultaneously. With one
stratum this is WSR's own CS at δ. With several, :class:`~certeval.estimators.single.adaptive.AdaptiveMethod`'s
joint confidence sequence is tighter (no union bound, no ``log(H/δ)`` per stratum) and is the default for the
bank target; this construction remains for ``target='distribution'`` and for ``combine='union'``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..validation import check_in_range, check_positive_int
from .bounds import BettingCS
from .strata import StratifiedMethod, bernstein_proxy, greedy_allocation


def check_bet_tuning(halfwidth, horizon) -> None:
    """Validation step for the bet tuning of the exact CSs: a half-width in (0, 1) or a horizon ≥ 1 item."""
    if halfwidth is not None:
        check_in_range(halfwidth, "bet_halfwidth", 0.0, 1.0, closed=False)
    if horizon is not None:
        check_positive_int(horizon, "bet_horizon")


def _pack(mask: np.ndarray) -> str:
    """A boolean grid as run lengths, ``"r<false-run>,<true-run>,..."`` (a rejected set is a few runs: ~20
    characters where the hex bitmask of a 4097-point grid took 1,026, in every state of every round)."""
    mask = np.asarray(mask, dtype=bool)
    if mask.size == 0:
        return "r"
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    runs = np.diff(np.concatenate([[0], edges, [mask.size]]))
    if mask[0]:
        runs = np.concatenate([[0], runs])
    return "r" + ",".join(str(int(r)) for r in runs)


def _unpack(text: str, size: int) -> np.ndarray:
    """Inverse of :func:`_pack`; hex bitmasks (states written before run lengths) are still read."""
    if not isinstance(text, str):
        raise InputError(f"state's rejected set must be a string, got {type(text).__name__}")
    if not text.startswith("r"):
        return np.unpackbits(np.frombuffer(bytes.fromhex(text), dtype=np.uint8))[:size].astype(bool)
    try:
        runs = np.array([int(r) for r in text[1:].split(",") if r], dtype=np.int64)
    except ValueError:
        raise InputError("state's rejected set is damaged (run lengths are not integers)") from None
    if (runs < 0).any() or int(runs.sum()) != size:
        raise InputError(f"state's rejected set is damaged (run lengths sum to {int(runs.sum())}, not {size})")
    return np.repeat(np.arange(runs.size) % 2 == 1, runs)


class BettingStrataMethod(StratifiedMethod):
    """Per-stratum betting confidence sequences (without replacement for ``target='bank'``)."""

    anytime_valid = True

    def __init__(self, confidence: float = 0.95, target: str = "bank", grid_size: int = 4097,
                 bet_halfwidth: float | None = None, bet_horizon: int | None = None) -> None:
        super().__init__(confidence=confidence, target=target)
        self.grid_size = grid_size
        self.bet_halfwidth = bet_halfwidth
        self.bet_horizon = bet_horizon

    def _validate_params(self) -> None:
        super()._validate_params()
        check_positive_int(self.grid_size, "grid_size", minimum=65)
        check_bet_tuning(self.bet_halfwidth, self.bet_horizon)

    def _start_strata(self) -> None:
        self.cs_ = {}
        # bets tuned to the goal's half-width where one stratum carries the whole estimand; a stratum of a
        # union has its own (unknown) share of the width, so it keeps the all-times plug-in
        one = self._live_strata.size == 1
        for h in self._live_strata:
            population = int(self.stratum_size_[h]) if self.target == "bank" else None
            self.cs_[int(h)] = BettingCS(self._stratum_delta, population, grid_size=int(self.grid_size),
                                         bet_halfwidth=self.bet_halfwidth if one else None,
                                         bet_horizon=self.bet_horizon if one else None)

    def _absorb_stratum(self, h: int, scores: np.ndarray) -> None:
        self.cs_[h].update(scores)

    def _stratum_interval(self, h: int) -> tuple[float, float]:
        lo, hi = self.cs_[h].interval()
        return self._clip_to_feasible(h, lo, hi)

    # running intersections and rejected grids cannot be replayed from one batch: store them
    def _state_extra(self) -> dict[str, Any]:
        return {
            "running": {str(h): list(cs.running) for h, cs in self.cs_.items()},
            "rejected": {str(h): _pack(cs.rejected) for h, cs in self.cs_.items()},
        }

    def _load_extra(self, extra: dict[str, Any]) -> None:
        for key, (lo, hi) in (extra.get("running") or {}).items():
            cs = self.cs_.get(int(key))
            if cs is None:
                raise InputError(f"state names stratum {key!r}, which the bank does not have")
            cs.running = (max(cs.running[0], float(lo)), min(cs.running[1], float(hi)))
        for key, text in (extra.get("rejected") or {}).items():
            cs = self.cs_[int(key)]
            cs.rejected |= _unpack(text, cs.grid.size)

    def _choose_union(self, k: int, rng: np.random.Generator):
        """A batch of k allocated greedily, one slot at a time, to the stratum with the largest reduction of
        ``W_h r_h(n_h)`` (``r_h`` an empirical-Bernstein proxy radius at δ/H); uniform draws inside a stratum."""
        avail = self.available()
        if self._live_strata.size <= 1:
            return rng.choice(avail, size=k, replace=False), None
        strata_avail = self.strata_[avail]
        capacity = np.bincount(strata_avail, minlength=self.n_strata)
        pending = np.bincount(self.strata_[self.pending_], minlength=self.n_strata)
        counts = self.stratum_n_ + pending
        n = np.maximum(self.stratum_n_, 1)
        mean = self.stratum_sum_ / n
        var = (0.25 + np.maximum(self.stratum_sumsq_ - self.stratum_n_ * mean**2, 0.0)) / (self.stratum_n_ + 1)
        size = np.maximum(self.stratum_size_, 1)[:, None]
        var = var[:, None]
        log_term = math.log(2.0 / self._stratum_delta)
        weight = self.stratum_weight_[:, None]

        def gain(c):
            r0 = bernstein_proxy(c, size, var, log_term)
            return weight * np.where(np.isinf(r0), np.inf, r0 - bernstein_proxy(c + 1, size, var, log_term))

        alloc = greedy_allocation(k, gain, counts, capacity)
        chosen, probs = [], []
        for h in np.flatnonzero(alloc):
            pool = avail[strata_avail == h]
            chosen.append(rng.choice(pool, size=int(alloc[h]), replace=False))
            probs.append(np.full(int(alloc[h]), 1.0 / pool.size))
        return np.concatenate(chosen), np.concatenate(probs)
