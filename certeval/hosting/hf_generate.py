"""Greedy decoding of a left-padded batch in which a row leaves the batch as soon as it is done.

``model.generate`` (and lm-eval's hf model, which calls it) keeps every row of a batch in each forward pass until
the last row stops: a row that has met its stop string goes on being computed, its tokens thrown away. Here, after
each step, the rows that emitted an end-of-sequence token, whose text now holds a stop string or that reached the
budget are taken out of the input, the attention mask, the position ids and the key/value cache (the cache's
``batch_select_indices``), so a batch pays only for the rows still generating. Each remaining row's forward pass is
the one ``generate`` computes for it: the same inputs, position ids from the attention mask (``cumsum - 1``, 0 on
padding, then one more per step), the mask dropped when the prompt has no padding, the logits of the last position
only, the argmax of their float32 values (ties to the lowest token id).

The prompt's pass (prefill) can run in groups of consecutive rows (at most ``GreedyBatch.prefill_rows``), each padded
only to its own longest prompt, whose caches are then left-padded to the batch's width and joined for decoding; the
joined cache and mask are what one pass over the whole batch would have made (a padded key is masked out either way).
On CPU, prompts of 60-170 tokens prefilled 8 rows at a time took 13-17% less time than 16 at a time (SmolLM2-135M,
float32, two threads; docs/pipeline.md). Only a cache of plain full-attention layers is joined; any other (sliding
windows, recurrent states) gets one pass over the whole batch.
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
    prefill_rows: int | None = None  # at most this many rows per prompt pass (None: the whole batch in one)


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
    chosen, cache = _prefill(model, batch, positions if with_positions else None, extra)
    for step in range(batch.budget):
        if step:
            if with_positions:
                extra["position_ids"] = positions
            out = model(input_ids=chosen[:, None], attention_mask=attention, past_key_values=cache, use_cache=True,
                        **extra)
            cache = out.past_key_values
            chosen = _greedy(out.logits)
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
        positions = positions[:, -1:] + 1
        if attention is not None:
            attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=-1)
    return tokens


def _greedy(logits: Any) -> Any:
    import torch

    return logits[:, -1].to(dtype=torch.float32).argmax(-1)


def _prefill(model: Any, batch: GreedyBatch, positions: Any, extra: dict[str, Any]) -> tuple[Any, Any]:
    """The first new token of each row and the cache of the prompts: one pass over the batch, or one per group of
    at most ``batch.prefill_rows`` rows whose caches are joined (when every layer of the model's cache is a plain
    full-attention one)."""
    import torch

    n_rows = batch.ids.shape[0]
    groups = -(-n_rows // (batch.prefill_rows or n_rows))
    step = -(-n_rows // groups)  # groups of near-equal size (9 rows: 5 + 4, not 8 + 1: one row alone passes slowly)
    # groups need position ids (a model that takes none would number a narrower group's tokens differently) and
    # a cache that can be joined
    if step < n_rows and (positions is None or not _joinable(_empty_cache(model))):
        step = n_rows
    passes = []
    for start in range(0, n_rows, step):
        mask = batch.mask[start:start + step]
        # leading columns that are padding in every row of this group (one pass over the batch keeps its width,
        # which the decoding steps' mask has)
        left = int((mask.sum(0) == 0).sum()) if step < n_rows else 0
        out = _forward(model, batch.ids[start:start + step, left:], mask[:, left:],
                       None if positions is None else positions[start:start + step, left:], extra)
        if step < n_rows and not _joinable(out.past_key_values):  # the model made a cache of its own kind
            out = _forward(model, batch.ids, batch.mask, positions, extra)
            return _greedy(out.logits), out.past_key_values
        passes.append((left, _greedy(out.logits), out.past_key_values))
    if len(passes) == 1:
        return passes[0][1], passes[0][2]
    cache = passes[0][2]
    for index, layer in enumerate(cache.layers):
        parts = [(left, part.layers[index]) for left, _, part in passes]
        layer.keys = torch.cat([_left_pad(p.keys, left) for left, p in parts])
        layer.values = torch.cat([_left_pad(p.values, left) for left, p in parts])
    return torch.cat([chosen for _, chosen, _ in passes]), cache


def _left_pad(states: Any, columns: int) -> Any:
    """``columns`` zero positions before a group's cached keys or values (rows x heads x positions x dims), which
    brings them to the batch's width: the batch's mask hides those positions from the group's rows."""
    import torch

    return torch.nn.functional.pad(states, (0, 0, columns, 0)) if columns else states


def _forward(model: Any, ids: Any, mask: Any, positions: Any, extra: dict[str, Any]) -> Any:
    kw = extra if positions is None else dict(extra, position_ids=positions)
    return model(input_ids=ids, attention_mask=None if bool(mask.all()) else mask, use_cache=True, **kw)


def _empty_cache(model: Any) -> Any:
    from transformers.cache_utils import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 -- a config the cache cannot read (remote code): one pass, nothing joined
        return None


def _joinable(cache: Any) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)
