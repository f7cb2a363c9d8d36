"""Frozen result types shared by every method (statsmodels-style results).

An :class:`Estimate` states what it estimates (``target``), at which confidence
level (fixed before data arrived), and which guarantee applies (``anytime_valid``
and a one-line ``guarantee``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


def to_jsonable(value: Any, strict: bool = True) -> Any:
    """JSON-safe copy: numpy scalars/arrays to Python, tuples to lists, NaN/inf to None (strict JSON).

    The one converter of a stored value to plain data: certeval's JSON files and outputs
    (``certeval.storage.dumps``), a bank's cells (a Parquet list column reads back as numpy arrays, a CSV or
    Parquet gap as NaN or ``pd.NA``: plain lists and None, as from JSONL), the items sent to a model and the hash
    inputs of the score cache (``certeval.storage.cache``) all go through it, so the same item reads the same
    whatever file it came from. ``strict=False`` keeps non-finite floats as they are (a method's in-memory
    ``state()``, which the storage layer encodes)."""
    if isinstance(value, float):
        return float(value) if (not strict or math.isfinite(value)) else None
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, strict) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":  # whole arrays at once (features: 10^5+)
        if value.dtype.kind != "f" or not strict or bool(np.isfinite(value).all()):
            return value.tolist()
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values (nullable columns, dates)
        return None
    if hasattr(value, "tolist") and not isinstance(value, bytes):
        return to_jsonable(value.tolist(), strict)
    if hasattr(value, "isoformat"):  # datetime, date, pd.Timestamp
        return value.isoformat()
    return value


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval.

    ``mean`` is ``nan`` (never 0.0) when nothing has been scored; then
    ``lower``/``upper`` are the trivial bounds 0 and 1 of a score in [0, 1].
    """

    method: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    confidence: float
    anytime_valid: bool
    target: str = "bank"  # "bank": the finite bank's mean; "distribution": i.i.d. view
    n_total: int | None = None  # bank size
    guarantee: str = ""
    exhausted: bool = False  # every item of the bank has been scored
    # "exact": the coverage holds at every sample size (finite-sample bound); "asymptotic": only as the sample
    # grows (CLT / martingale-CLT intervals such as FAQ's, anytime or not) — never to be mistaken for exact;
    # "heuristic": no proof covers the interval as run (Cer-Eval's Alg. 1–2 as printed, measured below level)
    validity: str = "exact"
    subsets: tuple[SubsetEstimate, ...] = field(default_factory=tuple)
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    @property
    def halfwidth(self) -> float:
        return 0.5 * (self.upper - self.lower)

    def ci(self) -> tuple[float, float]:
        """The confidence interval ``(lower, upper)``."""
        return (self.lower, self.upper)

    confidence_interval = ci

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["halfwidth"] = self.halfwidth
        out["subsets"] = [s.to_dict() for s in self.subsets]
        out["extra"] = {k: v for k, v in self.extra}
        return to_jsonable(out)


@dataclass(frozen=True)
class SubsetEstimate:
    """Per-subset interval reported beside a mean-of-means estimate."""

    subset: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    n_total: int
    weight: float

    def ci(self) -> tuple[float, float]:
        return (self.lower, self.upper)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))


@dataclass(frozen=True)
class Decision:
    """What a stopping rule concluded at a look.

    ``done`` says whether sampling may stop; ``rule`` names the rule that fired
    (``"precision"``, ``"above"``, ``"below"``, ``"exhausted"``, ``"budget"``,
    ``"futility"``, ``"diminishing-returns"``, ...); ``reached`` is False when the
    run stopped without meeting the user's goal (bank or budget exhausted).
    """

    done: bool
    rule: str | None = None
    look: int | None = None
    reached: bool = False
    verdict: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))
