"""Group-sequential boundaries by recursive numerical integration.

The joint law of the standardised statistics ``Z_1..Z_K`` at information fractions
``t_1 < ... < t_K = 1`` is that of Brownian motion: the score ``S_k = Z_k sqrt(t_k)`` has
independent increments ``S_k - S_{k-1} ~ N(drift*(t_k - t_{k-1}), t_k - t_{k-1})`` and
``Corr(Z_i, Z_j) = sqrt(t_i / t_j)``.  Crossing probabilities are computed by the
Armitage–McPherson–Rowe (1969) recursion, carrying the sub-density of ``S_k`` on the
continuation region from look to look (Jennison & Turnbull 2000, ch. 19, eq. 19.2–19.4),
with Simpson's rule on a uniform grid and the exact normal tail in the last step.

Boundaries:

* ``pocock``           constant ``c`` at every look (Pocock 1977);
* ``obrien-fleming``   ``c / sqrt(t_k)``, i.e. ``c sqrt(K/k)`` at equal looks (O'Brien & Fleming 1979);
* ``ld-pocock``        Lan–DeMets spending ``alpha * ln(1 + (e - 1) t)`` (Lan & DeMets 1983);
* ``ld-obf``           Lan–DeMets O'Brien–Fleming-type spending of one tail, ``2 - 2 Phi(z_{a/2} / sqrt(t))``
                       at one-sided level ``a``; a two-sided symmetric design spends ``a = alpha/2`` on each
                       side (gsDesign ``test.type = 2`` with ``sfLDOF``, rpact's ``asOF``), so its total is
                       ``4 - 4 Phi(z_{alpha/4} / sqrt(t))``;
* ``ld-obf-1983``      the two-sided form of Lan & DeMets (1983): ``2 - 2 Phi(z_{alpha/2} / sqrt(t))`` for the
                       total two-sided alpha (it spends less early than ``ld-obf``; both reach alpha at t = 1);
* ``hsd:G``            Hwang–Shih–DeCani ``alpha (1 - e^{-G t}) / (1 - e^{-G})`` (``G = 0``: ``alpha t``).

Two-sided designs are symmetric and ``alpha`` is the *total* level, split over both tails.
Optional futility boundaries (one-sided designs) come from beta-spending under the drift
that makes the last futility and efficacy boundaries meet; they are non-binding: the
efficacy boundaries are computed as if futility never stopped the trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize, special

from certeval.errors import InputError

from ..validation import check_alpha, check_positive_int, parse_finite

CLASSICAL = ("pocock", "obrien-fleming")
SPENDING_NAMES = ("pocock", "obrien-fleming", "ld-pocock", "ld-obf", "ld-obf-1983", "hsd:G")
_GRID_STEP = 0.02  # grid spacing on the standardised scale; Simpson error ~ step^4
_TAIL = 8.5  # grid covers mean +- 8.5 sd; mass beyond is < 1e-16
_Z_MAX = 12.0  # a boundary that never rejects is reported as this value


def _norm_sf(x: np.ndarray | float) -> np.ndarray | float:
    return 0.5 * special.erfc(np.asarray(x) / math.sqrt(2.0))


def _norm_cdf(x: np.ndarray | float) -> np.ndarray | float:
    return 0.5 * special.erfc(-np.asarray(x) / math.sqrt(2.0))


def _norm_pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


# --------------------------------------------------------------------------- spending
def parse_spending(spending: str) -> tuple[str, float | None]:
    """``'hsd:-4'`` → ``('hsd', -4.0)``; other names → ``(name, None)``.  Raises InputError."""
    if not isinstance(spending, str):
        raise InputError(f"spending must be one of {', '.join(SPENDING_NAMES)}; got {spending!r}")
    text = spending.strip().lower()
    if text.startswith("hsd"):
        _, sep, raw = text.partition(":")
        if not sep:
            return "hsd", 1.0
        return "hsd", parse_finite(raw, f"spending hsd:G needs a number G, got {spending!r}",
                                   f"spending hsd:G needs a finite G, got {spending!r}")
    if text in ("pocock", "obrien-fleming", "ld-pocock", "ld-obf", "ld-obf-1983"):
        return text, None
    aliases = {"obf": "obrien-fleming", "of": "obrien-fleming", "ld-of": "ld-obf"}
    if text in aliases:
        return aliases[text], None
    raise InputError(f"spending must be one of {', '.join(SPENDING_NAMES)}; got {spending!r}")


def spending_function(name: str, param: float | None, level: float, t: np.ndarray, sides: int = 1) -> np.ndarray:
    """Cumulative error spent by information fraction ``t`` (Lan & DeMets 1983; Hwang, Shih & DeCani 1990).

    ``level`` is the total error of the design (alpha, or beta for futility); ``sides`` = 2 for a symmetric
    two-sided design. Only ``ld-obf`` depends on it: gsDesign and rpact spend ``level/2`` per side with the
    one-sided function (the others are proportional to ``level``, so per side or in total is the same).
    """
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)

    def obf(one_sided: float) -> np.ndarray:
        z = special.ndtri(1.0 - one_sided / 2.0)
        with np.errstate(divide="ignore"):
            return np.where(t > 0, 2.0 - 2.0 * _norm_cdf(z / np.sqrt(np.where(t > 0, t, 1.0))), 0.0)

    if name == "ld-pocock":
        out = level * np.log1p((math.e - 1.0) * t)
    elif name == "ld-obf":
        out = obf(level) if sides == 1 else 2.0 * obf(level / 2.0)
    elif name == "ld-obf-1983":
        out = obf(level)
    elif name == "hsd":
        gamma = float(param if param is not None else 1.0)
        if abs(gamma) < 1e-12:
            out = level * t
        else:
            out = level * (-np.expm1(-gamma * t)) / (-math.expm1(-gamma))
    else:
        raise InputError(f"{name!r} is not a spending function")
    return np.minimum(out, level)


# --------------------------------------------------------------------------- recursion
def _simpson_weights(n: int, step: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w * step / 3.0


def _grid(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Odd uniform grid on [lo, hi] (score scale) with Simpson weights."""
    n = max(5, int(math.ceil((hi - lo) / _GRID_STEP)) | 1)
    if n % 2 == 0:
        n += 1
    x = np.linspace(lo, hi, n)
    return x, _simpson_weights(n, (hi - lo) / (n - 1))


class _Recursion:
    """Sub-density of ``S_k`` on the continuation region, advanced one look at a time.

    ``drift`` is the mean of ``Z`` at ``t = 1`` (``E S(t) = drift * t``).
    """

    def __init__(self, drift: float = 0.0) -> None:
        self.drift = drift
        self.t_prev = 0.0
        self.x: np.ndarray | None = None  # grid (score scale)
        self.h: np.ndarray | None = None  # sub-density times Simpson weights

    def _increment(self, t: float) -> tuple[float, float]:
        dt = t - self.t_prev
        return self.drift * dt, math.sqrt(dt)

    def upper(self, t: float, z: float) -> float:
        """P(Z_k >= z and no earlier stop), with Z_k at fraction t."""
        mu, sd = self._increment(t)
        s = z * math.sqrt(t)
        if self.x is None:
            return float(_norm_sf((s - mu) / sd))
        return float(self.h @ _norm_sf((s - self.x - mu) / sd))

    def lower(self, t: float, z: float) -> float:
        """P(Z_k <= z and no earlier stop)."""
        mu, sd = self._increment(t)
        s = z * math.sqrt(t)
        if self.x is None:
            return float(_norm_cdf((s - mu) / sd))
        return float(self.h @ _norm_cdf((s - self.x - mu) / sd))

    def advance(self, t: float, z_low: float, z_high: float) -> None:
        """Move to look at fraction t with continuation region z_low < Z < z_high."""
        mu, sd = self._increment(t)
        center = self.drift * t
        root = math.sqrt(t)
        lo = max(z_low * root, center - _TAIL * root)
        hi = min(z_high * root, center + _TAIL * root)
        if hi <= lo:  # nothing continues
            self.x, self.h = np.array([0.0]), np.array([0.0])
            self.t_prev = t
            return
        x, w = _grid(lo, hi)
        if self.x is None:
            dens = _norm_pdf((x - mu) / sd) / sd
        else:
            dens = _norm_pdf((x[:, None] - self.x[None, :] - mu) / sd) @ self.h / sd
        self.x, self.h, self.t_prev = x, w * dens, t


# --------------------------------------------------------------------------- result
@dataclass(frozen=True)
class GroupSequentialBoundary:
    """Critical values ``boundaries[k]`` for ``Z_k`` at ``fractions[k]``.

    Two-sided: reject when ``|Z_k| >= boundaries[k]``; one-sided: when ``Z_k >= boundaries[k]``.
    ``alpha_spent[k]`` is the type-I error spent at look k (both tails for two-sided),
    ``cumulative`` its running sum.  ``futility`` (one-sided designs only) holds non-binding
    lower boundaries: stop for futility when ``Z_k <= futility[k]``; ``drift`` is then the
    mean of ``Z`` at ``t = 1`` under the design alternative and ``power`` the power there.
    """

    boundaries: tuple[float, ...]
    alpha_spent: tuple[float, ...]
    cumulative: tuple[float, ...]
    spending: str
    alpha: float
    sides: int
    fractions: tuple[float, ...]
    futility: tuple[float, ...] | None = None
    beta: float | None = None
    drift: float | None = None
    power: float | None = None

    @property
    def looks(self) -> int:
        return len(self.boundaries)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "boundaries": list(self.boundaries),
            "alpha_spent": list(self.alpha_spent),
            "cumulative": list(self.cumulative),
            "spending": self.spending,
            "alpha": self.alpha,
            "sides": self.sides,
            "fractions": list(self.fractions),
        }
        if self.futility is not None:
            out.update(futility=list(self.futility), beta=self.beta, drift=self.drift, power=self.power)
        return out


# --------------------------------------------------------------------------- validation
def check_fractions(fractions: Any, looks: int | None = None, *, require_end: bool = True) -> tuple[float, ...]:
    """Information fractions: strictly increasing, in (0, 1], ending at 1 unless ``require_end`` is False."""
    try:
        values = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        raise InputError(f"fractions must be numbers, got {fractions!r}") from None
    if not values:
        raise InputError("fractions must hold at least one information fraction, got none")
    if looks is not None and len(values) != looks:
        raise InputError(f"fractions must have one value per look ({looks}), got {len(values)}: {list(values)}")
    if not all(math.isfinite(v) for v in values) or values[0] <= 0 or values[-1] > 1 + 1e-12:
        raise InputError(f"fractions must lie in (0, 1], got {list(values)}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise InputError(f"fractions must be strictly increasing, got {list(values)}")
    if require_end and abs(values[-1] - 1.0) > 1e-9:
        raise InputError(f"fractions must end at 1 (the planned maximum), got {list(values)}")
    return tuple(min(v, 1.0) for v in values)


def equal_fractions(looks: int) -> tuple[float, ...]:
    looks = check_positive_int(looks, "looks (K)")
    return tuple((k + 1) / looks for k in range(looks))


# --------------------------------------------------------------------------- computation
def _crossing(rec: _Recursion, t: float, z: float, sides: int) -> float:
    p = rec.upper(t, z)
    return p + rec.lower(t, -z) if sides == 2 else p


def _classical(name: str, fractions: tuple[float, ...], alpha: float, sides: int) -> np.ndarray:
    shape = np.ones(len(fractions)) if name == "pocock" else 1.0 / np.sqrt(np.asarray(fractions))

    def total(c: float) -> float:
        rec, out = _Recursion(), 0.0
        for t, z in zip(fractions, c * shape):
            out += _crossing(rec, t, z, sides)
            rec.advance(t, -z if sides == 2 else -np.inf, z)
        return out - alpha

    c = optimize.brentq(total, 0.0 if sides == 1 else 0.5, 10.0, xtol=1e-10)
    return c * shape


def _solve_look(rec: _Recursion, t: float, target: float, sides: int) -> float:
    """The z with crossing probability ``target`` at this look given the recursion so far."""
    if target <= 1e-15:
        return _Z_MAX
    if _crossing(rec, t, _Z_MAX, sides) >= target:
        return _Z_MAX
    low = 0.0 if sides == 2 else -_Z_MAX
    if _crossing(rec, t, low, sides) <= target:
        return low  # asks for more error than can be spent: reject whenever possible
    return optimize.brentq(lambda z: _crossing(rec, t, z, sides) - target, low, _Z_MAX, xtol=1e-10)


def _spending_bounds(name: str, param: float | None, fractions: tuple[float, ...], alpha: float,
                     sides: int) -> np.ndarray:
    cum = spending_function(name, param, alpha, np.asarray(fractions), sides)
    inc = np.diff(np.concatenate([[0.0], cum]))
    rec, out = _Recursion(), []
    for t, target in zip(fractions, inc):
        z = _solve_look(rec, t, float(target), sides)
        out.append(z)
        rec.advance(t, -z if sides == 2 else -np.inf, z)
    return np.asarray(out)


def _spent(bounds: np.ndarray, fractions: tuple[float, ...], sides: int, drift: float = 0.0,
           futility: np.ndarray | None = None) -> np.ndarray:
    """Probability of rejecting at each look (efficacy crossing), under ``drift``."""
    rec, out = _Recursion(drift), []
    for k, (t, z) in enumerate(zip(fractions, bounds)):
        out.append(_crossing(rec, t, z, sides))
        low = -z if sides == 2 else (-np.inf if futility is None else futility[k])
        rec.advance(t, low, z)
    return np.asarray(out)


def _futility_bounds(name: str, param: float | None, fractions: tuple[float, ...], beta: float,
                     bounds: np.ndarray, drift: float, clip_last: bool = True) -> np.ndarray:
    """Lower boundaries spending ``beta`` under ``drift`` (continuation a_k < Z_k < b_k).

    Interim a_k are capped at b_k; the last one is left uncapped when ``clip_last`` is
    False so that the drift search sees a continuous gap a_K - b_K.
    """
    cum = spending_function(name, param, beta, np.asarray(fractions))
    inc = np.diff(np.concatenate([[0.0], cum]))
    rec, out = _Recursion(drift), []
    last = len(fractions) - 1
    for k, (t, target, b) in enumerate(zip(fractions, inc, bounds)):
        cap = _Z_MAX if (k == last and not clip_last) else b
        f = lambda a: rec.lower(t, a) - target  # noqa: E731 - small root function
        if target <= 1e-15 or f(-_Z_MAX) >= 0:
            a = -_Z_MAX
        elif f(cap) <= 0:
            a = cap
        else:
            a = optimize.brentq(f, -_Z_MAX, cap, xtol=1e-10)
        out.append(a)
        rec.advance(t, a, b)
    return np.asarray(out)


@lru_cache(maxsize=4096)
def _compute(spending: str, fractions: tuple[float, ...], alpha: float, sides: int,
             beta: float | None, beta_spending: str | None) -> GroupSequentialBoundary:
    name, param = parse_spending(spending)
    if name in CLASSICAL:
        bounds = _classical(name, fractions, alpha, sides)
    else:
        bounds = _spending_bounds(name, param, fractions, alpha, sides)
    spent = _spent(bounds, fractions, sides)
    futility = drift = power = None
    if beta is not None:
        bname, bparam = parse_spending(beta_spending or "ld-obf")
        if bname in CLASSICAL:
            raise InputError(f"beta spending must be a spending function (ld-pocock, ld-obf, hsd:G), got {beta_spending!r}")

        def gap(d: float) -> float:
            return _futility_bounds(bname, bparam, fractions, beta, bounds, d, clip_last=False)[-1] - bounds[-1]

        # the design drift makes the last futility and efficacy boundaries meet (J&T §7.2)
        drift = optimize.brentq(gap, 0.0, 2 * _Z_MAX, xtol=1e-8) if gap(0.0) < 0 else 0.0
        fut = _futility_bounds(bname, bparam, fractions, beta, bounds, drift)
        futility = tuple(float(a) for a in fut)
        power = float(_spent(bounds, fractions, sides, drift, fut).sum())
        drift = float(drift)
    return GroupSequentialBoundary(
        boundaries=tuple(float(b) for b in bounds),
        alpha_spent=tuple(float(s) for s in spent),
        cumulative=tuple(float(s) for s in np.cumsum(spent)),
        spending=spending,
        alpha=alpha,
        sides=sides,
        fractions=fractions,
        futility=futility,
        beta=beta,
        drift=drift,
        power=power,
    )


def group_sequential_boundary(
    looks: int | None = None,
    alpha: float = 0.05,
    spending: str = "pocock",
    *,
    fractions: Any = None,
    sides: int = 2,
    beta: float | None = None,
    beta_spending: str = "ld-obf",
    interim: bool = False,
) -> GroupSequentialBoundary:
    """Critical values of a group-sequential design (see the module docstring).

    Give ``looks`` (K equally spaced looks) and/or ``fractions`` (information fractions
    ``t_k``, strictly increasing, ending at 1).  ``interim=True`` accepts fractions that do
    not reach 1 yet — the boundaries of the looks taken so far of a spending-function
    design whose later looks are unplanned (valid because a spending design's boundary at
    look k depends only on ``t_1..t_k``).  ``beta`` adds non-binding futility boundaries
    (one-sided designs only).  Results are cached.
    """
    alpha = check_alpha(alpha)
    if sides not in (1, 2) or isinstance(sides, bool):
        raise InputError(f"sides must be 1 or 2, got {sides!r}")
    name, param = parse_spending(spending)
    canonical = name if param is None else f"hsd:{param:g}"
    if fractions is None:
        if looks is None:
            raise InputError("give looks (K) or fractions")
        fracs = equal_fractions(looks)
    else:
        if looks is not None:
            looks = check_positive_int(looks, "looks (K)")
        fracs = check_fractions(fractions, looks, require_end=not interim)
    if interim and name in CLASSICAL and abs(fracs[-1] - 1.0) > 1e-9:
        raise InputError(f"spending {canonical!r} is a classical boundary and needs all looks planned; "
                         "use ld-pocock, ld-obf or hsd:G for unplanned looks")
    if beta is not None:
        beta = check_alpha(beta, "beta")
        if sides != 1:
            raise InputError(f"futility (beta-spending) boundaries are for one-sided designs (sides=1), got sides={sides}")
    fracs = tuple(round(f, 12) for f in fracs)  # stable cache keys
    return _compute(canonical, fracs, round(alpha, 15), int(sides), beta, beta_spending if beta is not None else None)


def crossing_probabilities(boundary: GroupSequentialBoundary, drift: float = 0.0) -> np.ndarray:
    """P(reject at look k) under a drift (mean of Z at t = 1); ignores futility (non-binding)."""
    return _spent(np.asarray(boundary.boundaries), boundary.fractions, boundary.sides, drift)
