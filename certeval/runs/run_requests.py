"""What a run sends its model actors: each round split into cached scores and requests, each bank row turned
into the item a model sees (once per position), and its prompt hash (once per position)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from certeval.estimators.results import to_jsonable
from certeval.harnesses.lm_eval_tasks import DOC as LM_EVAL_DOC
from certeval.harnesses.lm_eval_tasks import TASK_META as LM_EVAL_TASK_META
from certeval.inputs.banks import Bank
from certeval.storage import prompt_hash


class ItemRequests:
    """A run's bank as model requests: each position's item and prompt hash built once and reused round after
    round (a ranking sends and stores each item for every model)."""

    def __init__(self, bank: Bank, keys: list[str]) -> None:
        self.bank = bank
        self.keys = keys
        self._records: dict[int, dict[str, Any]] = {}
        self._hash_by_pos = np.full(bank.n_items, None, dtype=object)
        self._hash_known = np.zeros(bank.n_items, dtype=bool)

    def split(self, items: dict[str, np.ndarray], cached: dict[str, dict[str, float]]
              ) -> tuple[dict[str, list[tuple[str, dict]]], dict[str, dict[str, float]]]:
        """A round's items per model split into scores the cache holds and requests for the model actors."""
        requests, hits = {}, {}
        for label, pos in items.items():
            cache = cached.get(label, {})
            found, todo = {}, []
            for p in pos:
                key = self.keys[p]
                if key in cache:
                    found[key] = cache[key]
                else:
                    todo.append((key, self.record(int(p))))
            hits[label], requests[label] = found, todo
        return requests, hits

    def record(self, pos: int) -> dict[str, Any]:
        """The item sent to a model actor for bank position ``pos``."""
        if pos not in self._records:
            frame = self.bank.frame
            self._records[pos] = (_item_record(frame, pos) if frame is not None
                                  else {"item_id": self.bank.item_ids[pos]})
        return self._records[pos]

    def prompt_hashes(self, needed: np.ndarray) -> np.ndarray:
        """Prompt hashes by bank position (object array; filled for ``needed`` positions, once each)."""
        for p in needed[~self._hash_known[needed]]:
            self._hash_by_pos[p] = prompt_hash(self.record(int(p)))
            self._hash_known[p] = True
        return self._hash_by_pos


def _item_record(frame: pd.DataFrame, pos: int) -> dict[str, Any]:
    """One bank row as plain data for a model actor (the one converter of stored values: numpy arrays as lists,
    NaN as None), without what the model is never shown (its embedding, the lm-eval task's metadata and doc)."""
    hidden = {"embedding", LM_EVAL_TASK_META, LM_EVAL_DOC}
    return {k: to_jsonable(v) for k, v in frame.iloc[int(pos)].items() if k not in hidden}
