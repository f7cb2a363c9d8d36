"""The typed entries of a backtest's result (:class:`certeval.api.BacktestResult`): one per rep (certify, rank,
select) or per sampled pair of models (compare), each checked against the exact answer on the whole bank.

Frozen dataclasses built from the JSON object :func:`certeval.backtests.commands.request_backtest` returns (what
``certeval backtest COMMAND --json`` prints); ``to_dict`` gives that object back. Fields a rep carries only
sometimes (rep 0's detail, a history share's split, the bank target's intervals) are None when absent and left
out of ``to_dict``. Cheap to import (dataclasses only): ``import certeval`` loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

__all__ = ["CertifiedModel", "CertifyRep", "ComparePair", "RankRep", "SelectRep", "REP_TYPES"]


def _plain(value: Any) -> Any:
    """A field's JSON value: tuples as lists, typed entries as their dicts."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


class _Entry:
    """``from_dict`` / ``to_dict`` for a rep's entry; ``_tuples``: fields whose lists become tuples (of tuples)."""

    _tuples: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Any:
        known = {f.name for f in fields(cls)}
        unknown = set(row) - known
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
        values = dict(row)
        for name in cls._tuples:
            if values.get(name) is not None:
                values[name] = tuple(tuple(v) if isinstance(v, list) else v for v in values[name])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if not (getattr(self, f.name) is None and f.default is None)}


@dataclass(frozen=True)
class CertifiedModel(_Entry):
    """One model in one certify rep: its interval, the items it scored, why it stopped, and whether the interval
    holds its exact bank mean."""

    model: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    rule: str
    reached: bool
    exact: float
    covered: bool


@dataclass(frozen=True)
class CertifyRep(_Entry):
    """Rep ``rep`` of a certify backtest: the live run with seed ``seed``, per model."""

    rep: int
    seed: int
    models: tuple[CertifiedModel, ...]

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> CertifyRep:
        return cls(rep=row["rep"], seed=row["seed"], models=tuple(CertifiedModel.from_dict(m) for m in row["models"]))


@dataclass(frozen=True)
class ComparePair(_Entry):
    """One sampled pair of a compare backtest over its reps: the exact bank difference and verdict, the reps'
    verdict counts, the cells used, and the share of reps whose verdict agrees, errs, or whose interval covers."""

    model_a: str
    model_b: str
    bank_diff: float
    truth: str
    fraction_used: float
    separated: float
    verdicts: Mapping[str, int]
    agreement: float
    error_rate: float
    coverage: float


@dataclass(frozen=True)
class RankRep(_Entry):
    """Rep ``rep`` of a rank backtest: its tie groups, the cells it used, its wrong statements (``errors``) and
    Kendall's tau against the exact bank means. Rep 0 adds the models, means, items used and comparisons; the bank
    target adds whether every model's interval held its exact mean; a history share adds its models and the cells
    the same models use without it."""

    _tuples: ClassVar[tuple[str, ...]] = ("tie_groups", "models", "means", "items_used", "comparisons",
                                          "history_models")

    rep: int
    fraction_used: float
    errors: int
    n_tie_groups: int
    models_leaving_early: float
    tie_groups: tuple[tuple[str, ...], ...]
    kendall_tau: float
    all_intervals_cover: bool | None = None
    models: tuple[str, ...] | None = None
    means: tuple[float, ...] | None = None
    items_used: tuple[int, ...] | None = None
    comparisons: tuple[Mapping[str, Any], ...] | None = None
    history_models: tuple[str, ...] | None = None
    fraction_used_without_history: float | None = None


@dataclass(frozen=True)
class SelectRep(_Entry):
    """Rep ``rep`` of a select backtest: the models selected and discarded, those wrongly so (``wrong``), the
    models truly below the threshold and whether every interval held its exact mean. Rep 0 adds each model's
    status and interval; a history share adds its models and the cells used without it."""

    _tuples: ClassVar[tuple[str, ...]] = ("selected", "discarded", "wrong", "models", "history_models")

    rep: int
    fraction_used: float
    selected: tuple[str, ...]
    truly_below: int
    discarded: tuple[str, ...]
    wrong: tuple[str, ...]
    all_intervals_cover: bool
    models: tuple[Mapping[str, Any], ...] | None = None
    history_models: tuple[str, ...] | None = None
    fraction_used_without_history: float | None = None


# per kind: the result's list of entries (compare: one per sampled pair) and the type of an entry
REP_TYPES: dict[str, tuple[str, type]] = {"certify": ("runs", CertifyRep), "compare": ("pairs", ComparePair),
                                          "rank": ("rankings", RankRep), "select": ("runs", SelectRep)}
