"""A whole text's log-likelihood in rolling windows, as lm-eval's hf model scores a ``loglikelihood_rolling``
request: the text's tokens predicted window by window, each window at most ``max_length`` tokens predicted after
one token of context (the first after the model's prefix token: BOS, else EOS), the windows disjoint, their sums
added (lm-eval's ``get_rolling_token_windows`` with ``context_len=1`` and ``make_disjoint_window``)."""

from __future__ import annotations

from typing import Any


def rolling_windows(tokens: list[int], prefix_token: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(context, predicted) token windows covering ``tokens`` once: the first predicts up to ``max_length`` tokens
    after ``prefix_token``; each later one the next ``max_length`` tokens after the ``max_length`` - n tokens before
    them (n: what it predicts), so no window is longer than ``max_length`` + 1 tokens."""
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    windows = [([prefix_token] + tokens[:first - 1], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_length)
        end = done + n
        window = tokens[max(0, end - max_length - 1):end - 1]
        windows.append((window, tokens[end - n:end]))
        done = end
    # disjoint: the context keeps only what precedes the predicted tokens
    return [(ctx[:len(ctx) - (len(pred) - 1)], pred) for ctx, pred in windows]


def prefix_token(tokenizer: Any) -> int:
    """lm-eval's hf ``prefix_token_id``: the tokenizer's BOS, else its EOS."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return int(bos if bos is not None else tokenizer.eos_token_id)


def rolling_loglikelihoods(host: Any, texts: list[str]) -> list[float]:
    """Each text's summed log-likelihood over its rolling windows, scored one row per window by the host's
    per-pair scorer (``_score_pairs``: the window's whole ``max_length`` + 1 tokens, its predicted tokens last)."""
    encoded: list[tuple[list[int], int]] = []
    owner: list[int] = []
    for i, text in enumerate(texts):
        for ctx, pred in rolling_windows(host._encode(text), prefix_token(host.tokenizer), host.options.max_length):
            encoded.append((ctx + pred, len(pred)))
            owner.append(i)
    sums = [0.0] * len(texts)
    for j, (loglik, _) in host._score_pairs(encoded, list(range(len(encoded)))).items():
        sums[owner[j]] += loglik
    return sums
