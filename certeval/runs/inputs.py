"""A run's inputs: its bank (a file, the bundled trivia, or the items replay models share) and its history priors,
loaded and fitted once by validation and handed to the flow as a :class:`PreparedRun`."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.inputs.banks import Bank, bank_from_frame, bank_from_scores, load_bank, load_scores
from certeval.inputs.model_spec import ModelSpec, parse_model_spec
from certeval.inputs.synthetic import is_synthetic, synthetic_scores

TRIVIA = "bundled:trivia"


@functools.lru_cache(maxsize=16)
def _scores(location: str) -> pd.DataFrame:
    return load_scores(location)


@functools.lru_cache(maxsize=32)
def _model_items(location: str, scored_only: bool = False) -> dict[str, np.ndarray]:
    """Each model's item ids in a scores file (``scored_only``: those with a score), found in one pass: a
    ``frame["model"] == name`` scan (or a pandas take) per model cost ~25 s per plan at openllm_tiny's 1,989
    models."""
    if is_synthetic(location):  # every model scores every item: one shared array, no table is built
        table = synthetic_scores(location)
        return dict.fromkeys(table.model_names, table.item_ids)
    frame = _scores(location)
    ids = frame["item_id"].astype(str).to_numpy(dtype=object)
    keep = frame["score"].notna().to_numpy() if scored_only else np.ones(len(frame), dtype=bool)
    return {str(k): ids[v[keep[v]]] for k, v in frame.groupby("model", sort=False).indices.items()}


def check_replay_coverage(specs: list[ModelSpec], bank: Bank) -> None:
    """Every replay model has a recorded score for every bank item (else its actor fails mid-run)."""
    ids = pd.Index(bank.item_ids).astype(str)
    seen: dict[int, pd.Index] = {}  # models of a synthetic table share one item array: checked once
    for spec in specs:
        if spec.kind != "replay":
            continue
        mine = _model_items(spec.location, True).get(spec.name)
        if mine is None:
            missing = ids
        else:  # the arrays live in _model_items' cache, so their ids are stable here
            if id(mine) not in seen:
                seen[id(mine)] = ids.difference(pd.Index(mine, dtype=object))
            missing = seen[id(mine)]
        if len(missing):
            raise InputError(f"replay model {spec.text!r} has no recorded score for {len(missing)} of the bank's "
                             f"{len(ids)} items (e.g. {missing[0]!r}); pass a bank it covers, or no --bank")


def load_run_bank(bank: str | None, models: tuple[str, ...]) -> Bank:
    """The bank of a run: a file / URL, ``bundled:trivia[?categories=..&limit=..&seed=..]``, or
    (replay models only, ``bank`` None) the items every model has a recorded score for."""
    if bank is None:
        specs = [parse_model_spec(m) for m in models]
        if any(s.kind != "replay" for s in specs):
            raise InputError("--bank is required unless every --model is a replay:<scores file>#<model> spec")
        common: list[str] | None = None
        last = None
        for s in specs:
            mine = _model_items(s.location).get(s.name)
            if mine is not None and mine is last:  # the same item array (a synthetic table): nothing to intersect
                continue
            last = mine
            mine = [] if mine is None else mine.tolist()
            ids = set(mine)
            common = [i for i in (common if common is not None else mine) if i in ids]
        if not common:
            raise InputError("the replay models share no scored item; pass --bank")
        if is_synthetic(specs[0].location):
            table = synthetic_scores(specs[0].location)
            return bank_from_frame(table.items_frame()[table.items_frame()["item_id"].isin(set(common))],
                                   f"synthetic scores {specs[0].location!r}")
        first = _scores(specs[0].location)
        first = first[first["model"] == specs[0].name]
        return bank_from_scores(first[first["item_id"].astype(str).isin(set(common))])
    if bank == TRIVIA or bank.startswith(TRIVIA + "?"):
        from certeval.inputs.trivia import load_trivia_spec  # the one reader of the spec (categories, limit, seed, mc)

        return bank_from_frame(load_trivia_spec(bank), f"bank {bank!r}")
    return load_bank(bank)


def run_history_priors(sources: tuple[str, ...], bank: Bank, labels: tuple[str, ...]) -> dict[str, Any]:
    """Per model label, the history prior fitted on every other history model (the model is left out)."""
    from certeval.inputs.history import history_prior, load_history

    loaded = load_history(sources)
    return {label: history_prior(loaded, bank, label) for label in labels}


class PreparedRun:
    """What validation loaded and fitted — the bank, the history priors — and, once claimed, whether the run
    resumes: handed to the flow in the same process so a run neither reloads the bank, nor refits its priors,
    nor claims its folder twice.

    Deliberately neither a dataclass nor a ``__dict__`` object: Prefect cannot encode it and records the flow
    parameter as ``<PreparedRun>`` instead of copying a bank into the flow-run record. A flow started without
    one (a deployment, another process) prepares from the plan (:func:`prepare_run`).
    """

    __slots__ = ("bank", "history", "resumed")

    def __init__(self, bank: Bank, history: dict[str, Any], resumed: bool | None = None) -> None:
        self.bank = bank
        self.history = history  # label -> HistoryPrior of method 'history'; empty without --history
        self.resumed = resumed  # None until claimed: the flow claims the folder itself

    def claimed(self, resumed: bool) -> PreparedRun:
        """The same inputs after :func:`claim_run` answered ``resumed``."""
        return PreparedRun(self.bank, self.history, bool(resumed))


def prepare_run(plan: Any) -> PreparedRun:
    """Load a validated plan's bank and fit its history priors (a flow started without a PreparedRun)."""
    bank = load_run_bank(plan.bank, plan.models)
    history = run_history_priors(plan.history, bank, tuple(plan.labels)) if plan.history else {}
    return PreparedRun(bank, history)
