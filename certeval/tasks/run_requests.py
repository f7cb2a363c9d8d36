"""What a run sends its model actors: each round split into cached scores and requests, each bank row turned
into the item a model sees (once per position), and its prompt hash. Split from :mod:`certeval.tasks.run`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..estimators.results import to_jsonable
from ..lm_eval_tasks import DOC as LM_EVAL_DOC
from ..lm_eval_tasks import TASK_META as LM_EVAL_TASK_META
from ..storage import prompt_hash


class RunRequests:
    """Mixed into :class:`certeval.tasks.run.Run` (its bank, keys, score cache and per-position memos)."""

    def requests(self, batch: Any) -> tuple[dict[str, list[tuple[str, dict]]], dict[str, dict[str, float]]]:
        """Split a round into cached scores and requests for the model actors."""
        requests, hits = {}, {}
        for label, pos in batch.items.items():
            cache = self.cached.get(label, {})
            found, todo = {}, []
            for p in pos:
                key = self.keys[p]
                if key in cache:
                    found[key] = cache[key]
                else:
                    todo.append((key, self._record(int(p))))
            hits[label], requests[label] = found, todo
        return requests, hits

    def _record(self, pos: int) -> dict[str, Any]:
        """The item sent to a model actor, built once per bank position (a ranking sends each item to
        every model)."""
        records = self._records
        if pos not in records:
            frame = self.bank.frame
            records[pos] = _item_record(frame, pos) if frame is not None else {"item_id": self.bank.item_ids[pos]}
        return records[pos]

    def _prompt_hash(self, pos: int) -> str:
        """The prompt hash of a bank position, computed once (a ranking stores each item for every model)."""
        hashes = self._prompt_hashes
        if pos not in hashes:
            hashes[pos] = prompt_hash(self._record(pos))
        return hashes[pos]

    def _prompt_hash_array(self, needed: np.ndarray) -> np.ndarray:
        """Prompt hashes by bank position (object array; filled for ``needed`` positions, once each)."""
        hashes = self._prompt_hash_by_pos
        for p in needed[~self._prompt_hash_known[needed]]:
            hashes[p] = self._prompt_hash(int(p))
            self._prompt_hash_known[p] = True
        return hashes


def _item_record(frame: pd.DataFrame, pos: int) -> dict[str, Any]:
    """One bank row as plain data for a model actor (the one converter of stored values: numpy arrays as lists,
    NaN as None), without what the model is never shown (its embedding, the lm-eval task's metadata and doc)."""
    hidden = {"embedding", LM_EVAL_TASK_META, LM_EVAL_DOC}
    return {k: to_jsonable(v) for k, v in frame.iloc[int(pos)].items() if k not in hidden}
