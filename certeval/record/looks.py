"""The look log's record (docs/architecture.md §5): one model at one look, written once with the round's rows.

A run computes each model's statistics at every look exactly once; :class:`LookRecord` is that record. The
round files store it as ``look_*`` columns beside the scored rows (every row of a model's look carries the
same values); results.json, the report and the console read it back with :func:`last_looks` /
:meth:`LookRecord.from_row` and never re-run an estimator. In a paired run ``mean/lower/upper`` is the one
interval shown for the model everywhere: the ranking's or selection's simultaneous interval where the group
has one per model (``interval`` says which), else the model's own method's; the pair's difference of a
comparison is recorded beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd

PREFIX = "look_"
NAN = float("nan")
PAIRED_FIELDS = ("interval", "group_mean", "group_lower", "group_upper", "pair_diff", "pair_lower", "pair_upper",
                 "pair_verdict")
TEXT_FIELDS = ("rule", "interval", "pair_verdict")


@dataclass(frozen=True)
class LookRecord:
    """One model's statistics at one look (see the module docstring); ``paired`` is not stored, it says
    whether the group and pair fields belong to this run."""

    n_scored: int
    mean: float
    lower: float
    upper: float
    rule: str | None = None
    paired: bool = False
    interval: str | None = None  # whose interval mean/lower/upper are: model / ranking / selection
    group_mean: float = NAN  # the group's own interval of the model (rank/select), as recorded before 'interval'
    group_lower: float = NAN
    group_upper: float = NAN
    pair_diff: float = NAN  # compare: the pair's difference and its interval
    pair_lower: float = NAN
    pair_upper: float = NAN
    pair_verdict: str | None = None

    def columns(self) -> dict[str, Any]:
        """The record as the round file's ``look_*`` columns (single-model runs: the model's estimate only)."""
        names = [f.name for f in fields(self) if f.name != "paired"]
        if not self.paired:
            names = [n for n in names if n not in PAIRED_FIELDS]
        return {PREFIX + n: getattr(self, n) for n in names}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LookRecord:
        """The record from a round file's row (older runs lack the later columns: defaults)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = PREFIX + f.name
            if f.name == "paired" or key not in row:
                continue
            value = row[key]
            if f.name in TEXT_FIELDS:
                value = None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
            elif f.name == "n_scored":
                value = int(value)
            else:
                value = float(value)
            values[f.name] = value
        return cls(paired=PREFIX + "pair_diff" in row, **values)


def last_looks(rounds: pd.DataFrame) -> dict[str, LookRecord]:
    """Each model's look record at its last recorded look (the ``look_*`` columns of its last round)."""
    if rounds is None or rounds.empty or PREFIX + "mean" not in rounds.columns:
        return {}
    cols = [c for c in rounds.columns if c.startswith(PREFIX)]
    frame = rounds.reset_index(drop=True)
    at = frame.groupby("model", sort=False)["round"].idxmax()  # every row of a look agrees
    last = frame.loc[at.to_numpy(), ["model", *cols]]
    return {str(row.pop("model")): LookRecord.from_row(row) for row in last.to_dict("records")}
