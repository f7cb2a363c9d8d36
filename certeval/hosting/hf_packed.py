"""Multiple choice in one forward pass per question: the context and all its choices packed in one row.

A packed row holds a question's context tokens, then each choice's continuation tokens one after another. A 4-D
attention mask lets every continuation token see the context and the earlier tokens of its own choice only, and the
position ids restart after the context for every choice, so each choice is computed as in its own sequence
(context + choice): the log-probabilities lm-eval's ``loglikelihood`` sums for it (Gao et al. 2021), up to float
rounding. The context is read once instead of once per choice: the live benchmark's trivia questions hold 21
context tokens and four choices of about 3, 33 tokens a row instead of 96 in four rows.

Only where it is the same computation: attention implementations that take an additive 4-D mask (``sdpa``,
``eager``), models whose forward takes ``position_ids`` and that attend to the whole context (no sliding window),
contexts of at least one token and no pair longer than the model's limit. :class:`certeval.hosting.hf.HFHost`
checks the first packed row of a model against the per-choice rows once and scores per choice from then on if
they differ (stderr says so).
"""

from __future__ import annotations

import inspect
from typing import Any

# a packed row's log-likelihoods may differ from the per-choice rows' by float rounding only, relative to the
# log-likelihood's size: float32 ~1e-5 measured; 16-bit floats keep ~3 digits. A wrong mask or wrong positions move a
# choice's log-likelihood by tenths of a nat or more.
SELF_CHECK_TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2, "float16": 2e-2}


def packable_model(model: Any) -> bool:
    """Whether ``model`` computes a packed row as it computes each choice's own row (see the module docstring)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    for source in (getattr(config, "text_config", None), config):
        if source is not None and getattr(source, "sliding_window", None):
            return False
    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def row_width(row: tuple[tuple[int, ...], list[tuple[int, list[int]]]]) -> int:
    """Tokens in a packed row: its context, then every choice."""
    return len(row[0]) + sum(len(c) for _, c in row[1])


def packed_rows(choices: dict[tuple[int, ...], list[tuple[int, list[int]]]], max_width: int
                ) -> list[tuple[tuple[int, ...], list[tuple[int, list[int]]]]]:
    """Rows (context, [(pair index, continuation tokens), ...]) of at most ``max_width`` tokens (a wider row's
    attention costs the square of its width), longest first so a batch holds similar widths."""
    rows = [row for row in choices.items() if row_width(row) <= max_width]
    rows.sort(key=lambda row: (-row_width(row), row[0]))
    return rows


def score_packed(model: Any, rows: list[tuple[tuple[int, ...], list[tuple[int, list[int]]]]], *, batch_size: int,
                 pad_id: int, device: str) -> dict[int, tuple[float, bool]]:
    """(sum of the continuation's token log-probs, every token the argmax) per pair index, ``batch_size`` rows a
    forward pass."""
    import torch

    dtype = next(model.parameters()).dtype
    blocked = torch.finfo(dtype).min
    out: dict[int, tuple[float, bool]] = {}
    with torch.inference_mode():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            width = max(row_width(row) for row in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            positions = torch.zeros((len(chunk), width), dtype=torch.long)
            allowed = torch.zeros((len(chunk), width, width), dtype=torch.bool)
            reads = []  # (pair index, row, input positions whose logits predict its tokens, its tokens)
            for row, (ctx, conts) in enumerate(chunk):
                n = len(ctx)
                ids[row, :n] = torch.tensor(ctx, dtype=torch.long)
                positions[row, :n] = torch.arange(n)
                allowed[row, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
                at = n
                for i, cont in conts:
                    m = len(cont)
                    ids[row, at:at + m] = torch.tensor(cont, dtype=torch.long)
                    positions[row, at:at + m] = torch.arange(n, n + m)
                    allowed[row, at:at + m, :n] = True
                    allowed[row, at:at + m, at:at + m] = torch.ones(m, m, dtype=torch.bool).tril()
                    # the context's last position predicts the first token, each token the next
                    reads.append((i, row, [n - 1, *range(at, at + m - 1)], cont))
                    at += m
                pad = torch.arange(at, width)
                allowed[row, pad, pad] = True  # padding sees itself only (a fully masked row would be NaN)
            mask = torch.zeros((len(chunk), 1, width, width), dtype=dtype).masked_fill_(~allowed[:, None], blocked)
            # only the positions that predict a continuation token get vocabulary logits: from each row's last
            # context position to the end
            keep = max(width - (len(ctx) - 1) for ctx, _ in chunk)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           position_ids=positions.to(device), logits_to_keep=keep).logits
            offset = width - keep
            out.update(read_logliks(logits, [(i, row, [p - offset for p in at], cont) for i, row, at, cont in reads]))
    return out


def read_logliks(logits: Any, reads: list[tuple[int, int, list[int], list[int]]]) -> dict[int, tuple[float, bool]]:
    """(sum of the tokens' log-probs, every token the argmax) per read ``(key, row, logit positions, tokens)``,
    computed where the logits are: only the positions read are log-softmaxed (in float32, as lm-eval's hf model
    does), and two small vectors come back instead of the vocabulary-wide log-probs of every kept position (on a GPU
    that copy, hundreds of MB a batch, cost more than the forward pass)."""
    import torch

    if not reads:
        return {}
    device = logits.device
    rows, positions, tokens, segments = [], [], [], []
    for k, (_, row, at, cont) in enumerate(reads):
        rows += [row] * len(at)
        positions += at
        tokens += cont
        segments += [k] * len(at)
    as_index = {"dtype": torch.long, "device": device}
    picked = torch.log_softmax(logits[torch.tensor(rows, **as_index), torch.tensor(positions, **as_index)].float(),
                               dim=-1)
    targets = torch.tensor(tokens, **as_index)
    segment = torch.tensor(segments, **as_index)
    token_lp = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    misses = (picked.argmax(dim=-1) != targets).to(torch.int32)
    sums = torch.zeros(len(reads), dtype=torch.float32, device=device).index_add_(0, segment, token_lp)
    wrong = torch.zeros(len(reads), dtype=torch.int32, device=device).index_add_(0, segment, misses)
    sums, wrong = sums.tolist(), wrong.tolist()  # the one copy back, and the one wait for the device
    return {key: (sums[k], wrong[k] == 0) for k, (key, _, _, _) in enumerate(reads)}
