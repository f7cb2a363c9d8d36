"""transformers host (``hf:<model dir>`` or ``hf:bundled:smollm2``), CPU or CUDA.

Options in the spec query: ``?device=cpu|cuda[:i]&dtype=float32|bfloat16|float16&batch=16
&max_new_tokens=16&scorer=NAME&max_length=N&threads=N``. ``max_length`` (tokens a request may hold; longer
contexts lose their start) defaults to the model's own limit, found as lm-eval's hf model finds it (the config's
``n_positions`` / ``max_position_embeddings`` / ``n_ctx``, else the tokenizer's, else 2048). ``threads`` sets torch's CPU thread
count for the hosting process; without it, a model actor's CPUs are shared among the calls it scores at once
(:meth:`certeval.hosting.pool_cpus.CpuPlan.calls_at_once`: one model on a 2-core machine gets both cores and scores
two calls at once, one torch thread each). On a shared, oversubscribed CPU, OpenMP threads spin-waiting for each
other made one 2-thread forward pass 11x slower than a 1-thread one (measured here): ``threads=1`` there.

Multiple choice (``mc-loglik``): the score of a choice is the sum of the log-probabilities of its continuation
tokens (lm-eval-harness ``loglikelihood``, Gao et al. 2021), the pair encoded as lm-eval's hf model encodes it
(:meth:`HFHost._pair_tokens`: the context's trailing whitespace moved onto the continuation, the whole string
encoded with the tokenizer's own special tokens and split after the context's tokens, an empty context replaced
by the BOS token, the last ``max_length + 1`` tokens kept). A question's context and all its choices go in one
packed row (:mod:`certeval.hosting.hf_packed`: the context is read once, each choice computed as in its own
sequence), ``batch`` rows a forward pass, longest first. What cannot be packed (no context tokens, a pair past the
model's limit, a model that attends differently) is scored one row per pair, left-padded so the continuation sits at
the end of every row, with only the last ``max continuation`` positions' logits materialised (``logits_to_keep``);
there the choices of a question that differ only in their last token (one-token answers) share one forward pass, as
in lm-eval's hf model. An lm-eval task's own requests (a LAMBADA pair, Winogrande's several contexts) are scored
the same way; a perplexity doc's text in lm-eval's rolling windows (:mod:`certeval.hosting.hf_rolling`); a run over
tasks of several output types asks each item as its own task does. Open questions: batched greedy generation, stopped at the
first newline; an lm-eval task's generation items at their own stop strings and budget, as lm-eval's hf model; a row
leaves its batch at its own stop (:mod:`certeval.hosting.hf_generate`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from certeval.errors import InputError
from certeval.inputs.model_spec import ModelSpec
from certeval.scoring import scorers as sc
from certeval.scoring.lm_eval_generation import GenerationRequest, cut_at_stop

from .base import ModelHost

_DTYPES = ("float32", "bfloat16", "float16")
CPU_PREFILL_ROWS = 8  # rows per prompt pass of a generation batch on CPU (certeval.hosting.hf_generate)


@dataclass(frozen=True)
class HFOptions:
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16
    max_new_tokens: int = 16
    max_length: int | None = None  # None: the model's own limit (model_max_length below)
    scorer: str | None = None  # None: mc-loglik when items have choices, else normalized
    threads: int | None = None  # torch CPU threads; None leaves torch's default
    trust_remote_code: bool = False  # the folder's own code (auto_map): only with --trust-remote-code


def parse_options(spec: ModelSpec, **kwargs: Any) -> HFOptions:
    """Options from keyword arguments, overridden by the spec's query string."""
    known = {"device", "dtype", "batch", "max_new_tokens", "max_length", "scorer", "threads", "trust_remote_code"}
    unknown = [k for k, _ in spec.options if k not in known]
    if unknown:
        raise InputError(f"unknown hf option {unknown[0]!r} in {spec.text!r}; options: {', '.join(sorted(known))}")
    device = str(spec.option("device", kwargs.get("device", "cpu")))
    dtype = str(spec.option("dtype", kwargs.get("dtype", "float32")))
    if dtype not in _DTYPES:
        raise InputError(f"model spec option dtype={dtype!r} in {spec.text!r}; dtypes: {', '.join(_DTYPES)}")
    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise InputError(f"model spec option device={device!r} in {spec.text!r} must be cpu, cuda or cuda:N")
    return HFOptions(
        device=device,
        dtype=dtype,
        batch_size=spec.number_option("batch", kwargs.get("batch_size", 16)),
        max_new_tokens=spec.number_option("max_new_tokens", kwargs.get("max_new_tokens", 16)),
        max_length=spec.number_option("max_length", kwargs.get("max_length"), low=8),
        scorer=spec.option("scorer", kwargs.get("scorer")),
        threads=spec.number_option("threads", kwargs.get("threads")),
        trust_remote_code=spec.flag_option("trust_remote_code"),
    )



def whitespace_onto_continuation(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval's ``_encode_pair``: a context's trailing whitespace moves to the continuation's start, so
    ``"… is " + "Warsaw"`` scores the tokens of ``" Warsaw"`` after ``"… is"`` (a trailing-space token left on the
    context changes every choice's log-likelihood)."""
    trailing = len(context) - len(context.rstrip())
    if not trailing:
        return context, continuation
    return context[:-trailing], context[-trailing:] + continuation


class SerialTokenizer:
    """A tokenizer whose calls run one at a time. A model actor on CPU scores several calls at once on threads
    (:meth:`certeval.hosting.pool_cpus.CpuPlan.calls_at_once`), which share the host's tokenizer; fast tokenizers
    have failed with "Already borrowed" when called from two threads at once (huggingface/tokenizers#537: the Rust
    object is borrowed mutably while transformers sets its padding and truncation). Tokenizing is a small part of
    a call; the forward passes, where the time goes, still run side by side. Attributes read through unchanged;
    ``tokenizer`` is the one wrapped."""

    def __init__(self, tokenizer: Any) -> None:
        import threading

        self.tokenizer = tokenizer
        self._lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "tokenizer" or name.startswith("__"):  # not set yet (a copy being built), or Python's protocols
            raise AttributeError(name)
        value = getattr(self.tokenizer, name)
        if not callable(value):
            return value

        def serial(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return serial


class HFHost(ModelHost):
    """A transformers causal LM kept in memory; scores batches of items (see module docstring)."""

    def __init__(self, spec: ModelSpec, model: Any, tokenizer: Any, options: HFOptions) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer if isinstance(tokenizer, SerialTokenizer) else SerialTokenizer(tokenizer)
        if options.max_length is None:  # the model's own limit, as lm-eval's hf model reads it
            options = replace(options, max_length=model_max_length(model, tokenizer))
        self.options = options
        if options.scorer is not None:
            sc.get_scorer(options.scorer)  # fail on an unknown scorer before any item is sent
        self.calls = 0
        self._packing: bool | None = None  # packed multiple-choice rows: None until checked once
        self._prefix: str | None = None  # the prefix token's text (lm-eval's tok_encode rule)

    # -------------------------------------------------------------- model primitives

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _tok_encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """lm-eval's ``HFLM.tok_encode`` (no ``add_bos_token`` given): the tokenizer's own special tokens (a BOS for
        tokenizers that add one), none when asked for none or when the text already starts with the prefix
        token's text."""
        if add_special_tokens is None and text.startswith(self._prefix_text()):
            add_special_tokens = False
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return list(self.tokenizer.encode(text, **kwargs))

    def _tok_encode_many(self, texts: list[str], prefix: str | None = None) -> list[list[int]]:
        """:meth:`_tok_encode` of each text, through the tokenizer's batch path (one call per kind of text instead of
        one per text: on a GPU the per-text calls cost more than the forward passes). A text starting with
        ``prefix`` (the prefix token's text unless given) gets no special tokens."""
        prefix = self._prefix_text() if prefix is None else prefix
        starts = [bool(prefix) and text.startswith(prefix) for text in texts]
        out: list[list[int]] = [[] for _ in texts]
        for skip in (False, True):
            which = [i for i, start in enumerate(starts) if start == skip]
            if which:
                kwargs = {"add_special_tokens": False} if skip else {}
                ids = self.tokenizer([texts[i] for i in which], **kwargs)["input_ids"]
                for i, tokens in zip(which, ids):
                    out[i] = list(tokens)
        return out

    def _prefix_text(self) -> str:
        if self._prefix is None:
            self._prefix = self.tokenizer.decode(self._prefix_id())
        return self._prefix

    def _prefix_id(self) -> int:
        """lm-eval's ``prefix_token_id``: the context of a request whose context is empty (BOS, else EOS)."""
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.tokenizer.eos_token_id)

    def _pair_tokens(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens) as lm-eval's ``loglikelihood`` / ``_encode_pair`` split a request:
        the context's trailing whitespace moved onto the continuation, the whole string encoded and the
        continuation being what follows the context's tokens; an empty context is the prefix token."""
        if context == "":
            cont = self._tok_encode(continuation, add_special_tokens=False)
            prefix = self._prefix_id()
            return ([prefix], cont) if not cont or cont[0] != prefix else (cont[:1], cont[1:])
        context, continuation = whitespace_onto_continuation(context, continuation)
        whole = self._tok_encode(context + continuation)
        ctx = self._tok_encode(context)
        return ctx, whole[len(ctx):]

    def _pairs_tokens(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """:meth:`_pair_tokens` of every pair, the distinct strings encoded in one batch."""
        moved = [None if context == "" else whitespace_onto_continuation(context, continuation)
                 for context, continuation in pairs]
        texts = list(dict.fromkeys(text for m in moved if m is not None for text in (m[0], m[0] + m[1])))
        tokens = dict(zip(texts, self._tok_encode_many(texts)))
        out = []
        for pair, m in zip(pairs, moved):
            if m is None:
                out.append(self._pair_tokens(*pair))
            else:
                ctx = tokens[m[0]]
                out.append((ctx, tokens[m[0] + m[1]][len(ctx):]))
        return out

    def loglikelihoods(self, pairs: list[tuple[str, str]]) -> tuple[list[float], list[int]]:
        """Sum of continuation-token log-probs for each (context, continuation), and tokens per pair."""
        sums, tokens, _ = self.loglikelihoods_greedy(pairs)
        return sums, tokens

    def loglikelihoods_greedy(self, pairs: list[tuple[str, str]]) -> tuple[list[float], list[int], list[bool]]:
        """:meth:`loglikelihoods`, and whether each continuation is the greedy one (every token the argmax), as
        lm-eval's ``loglikelihood`` answers ``(loglik, is_greedy)``.

        The choices of one question share a packed row (:mod:`certeval.hosting.hf_packed`: the context read once,
        each choice as in its own sequence); what cannot be packed is scored per pair (:meth:`_score_pairs`)."""
        split, encoded, first = [], [], []
        seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        for ctx, cont in self._pairs_tokens(pairs):
            # equal pairs (a question's duplicate choices) are scored once: equal log-likelihoods, so a tie goes to
            # the first choice, as in lm-eval (its requests of equal tokens share one computation)
            first.append(seen.setdefault((tuple(ctx), tuple(cont)), len(first)))
            split.append((ctx, cont) if first[-1] == len(first) - 1 else ([], []))
            # lm-eval's truncation: the last max_length + 1 tokens, the model reading all but the last
            tokens = (ctx + cont)[-(self.options.max_length + 1):]
            encoded.append((tokens, min(len(cont), len(tokens) - 1)))
        sums = [0.0] * len(encoded)
        greedy = [False] * len(encoded)
        done = self._score_packed(split) if self._packing is not False else {}
        for i, (ll, g) in done.items():
            sums[i], greedy[i] = ll, g
        rest = [i for i, (_, n_cont) in enumerate(encoded) if n_cont > 0 and i not in done and first[i] == i]
        for i, (ll, g) in self._score_pairs(encoded, rest).items():
            sums[i], greedy[i] = ll, g
        for i, j in enumerate(first):
            sums[i], greedy[i] = sums[j], greedy[j]
        return sums, [len(tokens) for tokens, _ in encoded], greedy

    def _score_packed(self, split: list[tuple[list[int], list[int]]]) -> dict[int, tuple[float, bool]]:
        """Packed rows for the pairs that can be packed (a context, a continuation, within the model's limit); the
        first row of a host is checked once against :meth:`_score_pairs` (packing is switched off if they differ)."""
        from . import hf_packed

        if self._packing is None and not hf_packed.packable_model(self.model):
            self._packing = False
        if self._packing is False:
            return {}
        choices: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i, (ctx, cont) in enumerate(split):
            if ctx and cont and len(ctx) + len(cont) <= self.options.max_length:
                choices.setdefault(tuple(ctx), []).append((i, cont))
        rows = hf_packed.packed_rows(choices, self.options.max_length)
        if not rows:
            return {}
        kw = {"batch_size": self.options.batch_size, "pad_id": self._pad_id(), "device": self.options.device}
        if self._packing is None:
            first = hf_packed.score_packed(self.model, rows[:1], **kw)
            members = [i for i, _ in rows[0][1]]
            plain = self._score_pairs([(list(rows[0][0]) + cont, len(cont)) for _, cont in rows[0][1]],
                                      list(range(len(members))))
            gap = max(abs(first[i][0] - plain[j][0]) for j, i in enumerate(members))
            tolerance = hf_packed.SELF_CHECK_TOLERANCE.get(self.options.dtype, 2e-2)
            self._packing = gap <= tolerance * max(1.0, max(abs(v[0]) for v in plain.values()))
            if not self._packing:
                print(f"certeval: {self.spec.text}: a packed multiple-choice row differs from its per-choice rows by "
                      f"{gap:.3g} in log-likelihood; scoring each choice in its own row", file=sys.stderr, flush=True)
                return {}
            return first | hf_packed.score_packed(self.model, rows[1:], **kw)
        return hf_packed.score_packed(self.model, rows, **kw)

    def _score_pairs(self, encoded: list[tuple[list[int], int]], which: list[int]) -> dict[int, tuple[float, bool]]:
        """(log-likelihood, greedy) of the pairs ``which`` of ``encoded`` ((tokens, continuation length) each), one
        row per pair. Pairs whose token sequences differ only in their last token (one-token continuations) share a
        forward pass, as in lm-eval's hf model; rows are left-padded, longest first, ``batch`` a forward pass, and
        only the last ``max continuation`` positions' logits are materialised."""
        import torch

        from . import hf_packed

        out: dict[int, tuple[float, bool]] = {}
        groups: dict[tuple[int, ...], list[int]] = {}  # the model's input (all tokens but the last) -> its pairs
        for i in which:
            groups.setdefault(tuple(encoded[i][0][:-1]), []).append(i)
        prefixes = sorted(groups, key=lambda p: (-len(p), p))  # similar lengths share a batch
        pad_id = self._pad_id()
        device = self.options.device
        bs = self.options.batch_size
        with torch.inference_mode():
            for start in range(0, len(prefixes), bs):
                chunk = prefixes[start:start + bs]
                width = max(len(p) for p in chunk)
                keep = max(encoded[i][1] for p in chunk for i in groups[p])
                ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, prefix in enumerate(chunk):
                    ids[row, width - len(prefix):] = torch.tensor(prefix, dtype=torch.long)
                    mask[row, width - len(prefix):] = 1
                positions = (mask.cumsum(1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                    position_ids=positions.to(device), logits_to_keep=keep).logits
                # logits[:, j] predicts the token after input position width-keep+j: the last n_cont positions
                # predict a pair's n_cont continuation tokens (the last one its own, past the shared prefix)
                out.update(hf_packed.read_logliks(logits, [(i, row, list(range(keep - encoded[i][1], keep)),
                                                  encoded[i][0][-encoded[i][1]:])
                                                 for row, prefix in enumerate(chunk) for i in groups[prefix]]))
        return out

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[str], list[int]]:
        """Greedy completions, each stopped at its request's stop strings or budget (lm-eval's ``generate_until``:
        the context left-truncated to ``max_length - budget``, the text cut at the first stop string), and tokens
        used (prompt + generated) per request. Requests with the same stops and budget share batches, cut as
        lm-eval cuts them (longest prompt in tokens first); a row leaves its batch at its own stop
        (:func:`certeval.hosting.hf_generate.decode_greedy`)."""
        import torch

        from .hf_generate import GreedyBatch, decode_greedy

        texts: list[str] = [""] * len(requests)
        used: list[int] = [0] * len(requests)
        prompts = list(dict.fromkeys(request.prompt for request in requests))
        # lm-eval's tok_batch_encode (no add_bos_token given): the tokenizer's own special tokens (a BOS for the
        # tokenizers that add one), none for a prompt already starting with the BOS token's text
        encoded = dict(zip(prompts, self._tok_encode_many(prompts, prefix=self.tokenizer.bos_token or "")))
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault((request.until, request.max_tokens), []).append(i)
        pad_id = self._pad_id()
        end_ids = self._end_ids()
        # on CPU the prompts' pass runs at most 8 rows at a time (13-17% less time than 16 on 60-170-token prompts;
        # hf_generate's docstring); a GPU takes the whole batch in one pass
        prefill_rows = CPU_PREFILL_ROWS if self.options.device == "cpu" else None
        with torch.inference_mode():
            for (until, budget), members in groups.items():
                keep_prompt = max(1, self.options.max_length - budget)
                order = sorted(members, key=lambda i: (-len(encoded[requests[i].prompt]), requests[i].prompt))
                stops = [u for u in until if u]
                for start in range(0, len(order), self.options.batch_size):
                    chunk = order[start:start + self.options.batch_size]
                    rows = [list(encoded[requests[i].prompt][-keep_prompt:]) for i in chunk]
                    width = max(len(r) for r in rows)
                    ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                    mask = torch.zeros((len(chunk), width), dtype=torch.long)
                    for row, tokens in enumerate(rows):
                        ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
                        mask[row, width - len(tokens):] = 1
                    batch = GreedyBatch(ids.to(self.options.device), mask.to(self.options.device), budget, end_ids,
                                        self._stop_check(stops) if stops else None, prefill_rows)
                    for row, (i, new) in enumerate(zip(chunk, decode_greedy(self.model, batch))):
                        new = [t for t in new if t != pad_id]
                        texts[i] = cut_at_stop(self.tokenizer.decode(new, skip_special_tokens=True), requests[i])
                        used[i] = len(rows[row]) + len(new)
        return texts, used

    def _stop_check(self, stops: list[str]) -> Any:
        """Whether a row's new tokens hold one of ``stops`` (lm-eval's ``generate_until`` rule); the text is cut at
        the first one afterwards (:func:`~certeval.scoring.lm_eval_generation.cut_at_stop`), so stopping at the
        first step the string appears gives the text a later stop would. Checked on the decoded new tokens of each
        row still generating, once a step, instead of transformers' ``stop_strings``, whose criterion re-reads the
        whole vocabulary at every ``generate`` call."""
        decode = self.tokenizer.decode
        return lambda row, tokens: any(stop in decode(tokens, skip_special_tokens=True) for stop in stops)

    def _end_ids(self) -> frozenset[int]:
        """The tokens that end a row: the model's generation config's ``eos_token_id`` (one or several), which
        ``model.generate`` stops at when lm-eval's hf model calls it; the tokenizer's EOS when the config has none."""
        config = getattr(self.model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
        return frozenset(int(t) for t in ids)

    def _item_resps(self, requests: list[list[tuple[str, str]] | str]) -> tuple[list[list[list]], list[int]]:
        """lm-eval's answers to each item's log-likelihood requests, ``[[loglik, is_greedy], …]``, and the tokens
        each item used: (context, continuation) pairs scored together (:meth:`loglikelihoods_greedy`), a rolling
        text (a str) in its windows (:mod:`certeval.hosting.hf_rolling`; is_greedy None, as lm-eval gives none)."""
        from .hf_rolling import rolling_loglikelihoods

        pairs = [pair for request in requests if not isinstance(request, str) for pair in request]
        logliks, tokens, greedy = self.loglikelihoods_greedy(pairs) if pairs else ([], [], [])
        texts = [request for request in requests if isinstance(request, str)]
        rolled = iter(rolling_loglikelihoods(self, texts) if texts else [])
        resps, used, pos = [], [], 0
        for request in requests:
            if isinstance(request, str):
                resps.append([[next(rolled), None]])
                used.append(len(self._encode(request)))
                continue
            end = pos + len(request)
            resps.append([[ll, g] for ll, g in zip(logliks[pos:end], greedy[pos:end])])
            used.append(sum(tokens[pos:end]))
            pos = end
        return resps, used

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    # -------------------------------------------------------------- the host interface

    def scorer_for(self, items: list[dict[str, Any]]) -> sc.Scorer:
        fields = [k for k, v in items[0].items() if not sc._is_missing(v)] if items else []
        return sc.resolve_scorer(self.options.scorer, fields, source=f"item {items[0].get('item_id')!r}" if items else "bank")

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        if not items:
            return []
        t0 = time.perf_counter()
        scorer = self.scorer_for(items)
        if scorer.kind == sc.MIXED:  # tasks of several output types: each item asked and judged as its task's
            return self._score_by_task(items)
        return self._score_with(scorer, items, t0)

    def _score_by_task(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(sc.item_scorer(item).name, []).append(i)
        out: list[dict[str, Any]] = [{}] * len(items)
        for name, members in groups.items():
            for i, row in zip(members, self._score_with(sc.get_scorer(name, allow_import=False),
                                                        [items[i] for i in members], time.perf_counter())):
                out[i] = row
        return out

    def _score_with(self, scorer: sc.Scorer, items: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
        for item in items:
            scorer.check_item(item)
        if scorer.kind == sc.LOGLIK:
            resps, used = self._item_resps([sc.loglik_requests(item) for item in items])
            outputs = [r if scorer.resps else [ll for ll, _ in r] for r in resps]
        else:
            outputs, used = self.generate(sc.generation_requests(items, self.options.max_new_tokens))
            resps = [None] * len(items)
        scores = [sc.judge(scorer, out, item) for out, item in zip(outputs, items)]
        if scorer.resps:  # the text of an answer is read off its log-likelihoods, as for every other judge
            outputs = [[ll for ll, _ in r] for r in resps]
        share = (time.perf_counter() - t0) / len(items)  # per-item share of this call's wall time
        # resps: lm-eval's answer to each log-likelihood request, (loglik, is_greedy) per choice
        return [{"item_id": str(item["item_id"]), "score": s, "tokens": int(n), "latency_s": share,
                 "output": sc.output_text(out, item), **({"resps": r} if r is not None else {})}
                for item, s, n, out, r in zip(items, scores, used, outputs, resps)]

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec.text, "kind": "hf", "device": self.options.device, "dtype": self.options.dtype,
                "batch_size": self.options.batch_size, "threads": self.options.threads, "scorer": self.options.scorer or "auto"}

    def close(self) -> None:
        self.model = None
        if self.options.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


def load_model(model_dir: str, device: str = "cpu", dtype: str = "float32",
               trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Load a local transformers causal LM and its tokenizer, offline, in eval mode on ``device``; the folder's own
    code (``auto_map``) only when ``trust_remote_code`` (``--trust-remote-code``), else it is refused here too."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"model option device={device!r}, but no CUDA GPU is visible to torch")
    if not trust_remote_code:
        from certeval.inputs.model_folders import custom_code

        asks = custom_code(model_dir, "--model", model_dir) if os.path.isdir(model_dir) else None
        if asks:
            raise InputError(f"--model {model_dir!r} asks to run its own code ({asks}); certeval loads it only with "
                             "--trust-remote-code")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code)
    model.to(device).eval()
    return model, tokenizer


def build_host(spec: ModelSpec, *, cache_dir: str | None = None, **kwargs: Any) -> HFHost:
    from certeval.inputs.smollm import resolve_model_dir

    options = parse_options(spec, **kwargs)
    if options.scorer is not None:
        sc.get_scorer(options.scorer)
    model_dir = resolve_model_dir(spec.location, cache_dir)
    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
    model, tokenizer = load_model(str(model_dir), options.device, options.dtype, options.trust_remote_code)
    if options.device.startswith("cuda"):
        warm_up(model, options.batch_size)
    return HFHost(spec, model, tokenizer, options)


def warm_up(model: Any, batch_size: int) -> None:
    """One forward pass of a batch-sized input before the host answers: a GPU's first passes create its kernels'
    handles and workspaces (about a second for a 1B model on an H100, during which the GPU sits idle), which belong
    to loading the model, not to the first round that would otherwise pay them."""
    import torch

    device = next(model.parameters()).device
    ids = torch.zeros((batch_size, 32), dtype=torch.long, device=device)
    with torch.inference_mode():
        try:
            model(input_ids=ids, logits_to_keep=1)
        except TypeError:  # a model whose forward takes no logits_to_keep: the whole row's logits, once
            model(input_ids=ids)
    torch.cuda.synchronize(device)


def model_max_length(model: Any, tokenizer: Any) -> int:
    """The tokens a request may hold, by lm-eval's hf rule: the first of n_positions / max_position_embeddings /
    n_ctx in the config's text_config, then in the config, else the tokenizer's model_max_length unless it is a
    placeholder, else 2048."""
    config = getattr(model, "config", None)
    for source in (getattr(config, "text_config", None), config):
        for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
            value = getattr(source, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 1_000_000_000:
        return value
    return 2048
