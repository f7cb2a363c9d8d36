"""Input validation as its own named step (scipy.stats style).

Every check raises :class:`InputError` with a one-line message that names the
parameter and echoes the offending value, so the CLI can print it and exit 2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_confidence(confidence: float, name: str = "confidence") -> float:
    """Return ``confidence`` as float if it lies strictly inside (0, 1)."""
    try:
        value = float(confidence)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number in (0, 1), got {_short(confidence)}") from None
    if not (0.0 < value < 1.0) or math.isnan(value):
        raise InputError(f"{name} must lie strictly between 0 and 1, got {_short(confidence)}")
    return value


def check_alpha(alpha: float, name: str = "alpha") -> float:
    """Return a significance level strictly inside (0, 1)."""
    return check_confidence(alpha, name=name)


def check_positive(value: float, name: str) -> float:
    """Return ``value`` as float if it is finite and > 0."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a positive number, got {_short(value)}") from None
    if not math.isfinite(out) or out <= 0:
        raise InputError(f"{name} must be a positive number, got {_short(value)}")
    return out


def parse_finite(text: str, not_a_number: str, not_finite: str) -> float:
    """``text`` read as a finite float; else an InputError with the caller's one-line message: ``not_a_number``
    when it does not read as a number, ``not_finite`` for nan and infinities."""
    try:
        value = float(text)
    except ValueError:
        raise InputError(not_a_number) from None
    if not math.isfinite(value):
        raise InputError(not_finite)
    return value


def check_in_range(value: float, name: str, low: float, high: float, *, closed: bool = True) -> float:
    """Return ``value`` as float if it lies in [low, high] (or (low, high) when not closed)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number in [{low}, {high}], got {_short(value)}") from None
    ok = (low <= out <= high) if closed else (low < out < high)
    if not ok or math.isnan(out):
        brackets = f"[{low}, {high}]" if closed else f"({low}, {high})"
        raise InputError(f"{name} must lie in {brackets}, got {_short(value)}")
    return out


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``."""
    if isinstance(value, bool):
        raise InputError(f"{name} must be an integer >= {minimum}, got {_short(value)}")
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be an integer >= {minimum}, got {_short(value)}") from None
    if out != value and not (isinstance(value, float) and value.is_integer()):
        if not isinstance(value, (int, np.integer, str)):
            raise InputError(f"{name} must be an integer >= {minimum}, got {_short(value)}")
    if out < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {_short(value)}")
    return out


def check_scores(scores: Any, name: str = "scores") -> np.ndarray:
    """Return scores as a float array; every score must be finite and in [0, 1]."""
    arr = np.asarray(scores, dtype=float).reshape(-1)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise InputError(f"{name} must be finite, got {arr[bad][0]!r} at position {int(np.flatnonzero(bad)[0])}")
    out = (arr < 0.0) | (arr > 1.0)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise InputError(f"{name} must lie in [0, 1], got {arr[i]!r} at position {i}")
    return arr


def check_item_indices(items: Any, n_items: int, name: str = "items") -> np.ndarray:
    """Return item positions as an int64 array; each must be in [0, n_items)."""
    arr = np.asarray(items)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        as_float = arr.astype(float)
        if not np.all(np.isfinite(as_float)) or not np.all(as_float == np.round(as_float)):
            raise InputError(f"{name} must be integer item positions, got {_short(arr.tolist()[:5])}")
    arr = arr.astype(np.int64).reshape(-1)
    bad = (arr < 0) | (arr >= n_items)
    if bad.any():
        raise InputError(f"{name} must be positions in [0, {n_items}), got {int(arr[bad][0])}")
    return arr


def check_same_length(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise InputError(f"{name_a} and {name_b} must have the same length, got {len(a)} and {len(b)}")


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}; got {_short(value)}")
    return str(value)
