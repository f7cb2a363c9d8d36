"""Greedy decoding of a left-padded batch in which a row leaves the batch as soon as it is done.

``model.generate`` (and lm-eval's hf model, which calls it) keeps every row of a batch in each forward pass until
the last row stops: a row that has met its stop string goes on being computed, its tokens thrown away. Here, after
each step, the rows that emitted an end-of-sequence token, whose text now holds a stop string or that reached the
budget are taken out of the input, the attention mask, the position ids and the key/value cache (the cache's
``batch_select_indices``), so a batch pays only for the rows still generating. Each remaining row's forward pass is
the one ``generate`` computes for it: the same inputs, position ids from the attention mask (``cumsum - 1``, 0 on
padding, then one more per step), the mask dropped when the prompt has no padding, the logits of the last position
only, the argmax of their float32 values (ties to the lowest token id).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GreedyBatch:
    """A batch to decode: left-padded ``ids`` and their ``mask`` (long tensors, rows x width, on the model's device),
    at most ``budget`` new tokens a row; a row ends at a token of ``end_ids`` (kept as its last token) or once
    ``done(row, tokens)`` says its new tokens hold a stop string."""

    ids: Any
    mask: Any
    budget: int
    end_ids: frozenset[int]
    done: Callable[[int, list[int]], bool] | None = None


def decode_greedy(model: Any, batch: GreedyBatch) -> list[list[int]]:
    """The new tokens of each row of ``batch``, greedy, each row leaving the batch at its own last token."""
    import torch

    n_rows = batch.ids.shape[0]
    tokens: list[list[int]] = [[] for _ in range(n_rows)]
    if batch.budget < 1 or n_rows == 0:
        return tokens
    mask = batch.mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    attention = None if bool(mask.all()) else mask  # generate drops a mask without padding
    takes = inspect.signature(model.forward).parameters  # generate passes only what the model's forward takes
    extra = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}
    with_positions = "position_ids" in takes
    rows = list(range(n_rows))  # batch position -> row of the caller's batch
    ended: set[int] = set()
    inputs, cache = batch.ids, None
    for step in range(batch.budget):
        if with_positions:
            extra["position_ids"] = positions
        out = model(input_ids=inputs, attention_mask=attention, past_key_values=cache, use_cache=True, **extra)
        cache = out.past_key_values
        chosen = out.logits[:, -1].to(dtype=torch.float32).argmax(-1)
        for position, token in enumerate(chosen.tolist()):
            row = rows[position]
            if row in ended:  # only where the cache cannot drop rows
                continue
            tokens[row].append(token)
            if token in batch.end_ids or (batch.done is not None and batch.done(row, tokens[row])):
                ended.add(row)
        if len(ended) == n_rows or step == batch.budget - 1:
            break
        stay = [position for position, row in enumerate(rows) if row not in ended]
        if len(stay) < len(rows) and hasattr(cache, "batch_select_indices"):  # else every row stays in the batch
            index = torch.tensor(stay, device=chosen.device)
            cache.batch_select_indices(index)
            chosen, positions = chosen[index], positions[index]
            attention = attention[index] if attention is not None else None
            rows = [rows[p] for p in stay]
        inputs = chosen[:, None]
        positions = positions[:, -1:] + 1
        if attention is not None:
            attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=-1)
    return tokens
