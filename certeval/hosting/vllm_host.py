"""vLLM host (``vllm:<model dir>``), GPU only, optional extra (``pip install certeval[vllm]``).

Written against vLLM's public offline API (``vllm.LLM``, ``vllm.SamplingParams``) and imported
lazily inside :func:`build_host`, so certeval imports and runs everywhere else. Not exercised in
this repository's CI (no GPU, and ``from vllm import LLM`` fails on CPU machines, docs/environment.md).

Options: ``?gpus=1&load_format=auto|dummy|...&dtype=auto&max_model_len=4096
&gpu_memory_utilization=0.9&max_new_tokens=16&scorer=NAME&seed=0``.
``gpus`` is the tensor-parallel size of one replica (the pipeline reserves that many GPUs per
actor); ``load_format=dummy`` runs the model's config with random weights (real GPU cost, no
weights needed) for benchmarks.

Multiple choice: each (context, choice) pair is one prompt of token ids with
``SamplingParams(max_tokens=1, prompt_logprobs=0)``; vLLM returns, for every prompt position,
the log-probability of the actual prompt token, and the continuation's are summed (the same
quantity the hf host computes). Open questions: greedy ``temperature=0`` generation with
``stop=["\\n"]``. vLLM batches all prompts of a call itself (continuous batching).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from certeval.errors import InputError
from certeval.inputs.model_spec import ModelSpec
from certeval.scoring import scorers as sc
from certeval.scoring.lm_eval_generation import GenerationRequest, cut_at_stop

from .base import ModelHost
from .hf import whitespace_onto_continuation

NOT_INSTALLED = "vLLM is not installed (pip install certeval[vllm]); it needs a CUDA GPU"
_KNOWN = {"gpus", "load_format", "dtype", "max_model_len", "gpu_memory_utilization", "max_new_tokens", "scorer", "seed",
          "trust_remote_code"}


@dataclass(frozen=True)
class VLLMOptions:
    gpus: int = 1
    load_format: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    max_new_tokens: int = 16
    scorer: str | None = None
    seed: int = 0
    trust_remote_code: bool = False  # only with --trust-remote-code (certeval.inputs.model_folders)

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (tensor parallel size = GPUs per replica)."""
        out: dict[str, Any] = {"tensor_parallel_size": self.gpus, "load_format": self.load_format,
                               "dtype": self.dtype, "gpu_memory_utilization": self.gpu_memory_utilization,
                               "seed": self.seed}
        if self.trust_remote_code:  # only with --trust-remote-code (the folder's own code runs)
            out["trust_remote_code"] = True
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        return out


def parse_options(spec: ModelSpec, **kwargs: Any) -> VLLMOptions:
    """Options from keyword arguments, overridden by the spec's query; no vLLM import needed."""
    unknown = [k for k, _ in spec.options if k not in _KNOWN]
    if unknown:
        raise InputError(f"unknown vllm option {unknown[0]!r} in {spec.text!r}; options: {', '.join(sorted(_KNOWN))}")

    def get(key: str, default: Any) -> Any:
        return spec.option(key, kwargs.get(key, default))

    def number(key: str, default: Any, cast: type, low: float) -> Any:
        return spec.number_option(key, kwargs.get(key, default), cast, low)

    utilization = number("gpu_memory_utilization", 0.9, float, 0.01)
    if utilization > 1:
        raise InputError(f"model spec option gpu_memory_utilization={utilization} in {spec.text!r} must be <= 1")
    scorer = get("scorer", None)
    if scorer is not None:
        sc.get_scorer(scorer)
    return VLLMOptions(
        gpus=number("gpus", 1, int, 1),
        load_format=str(get("load_format", "auto")),
        dtype=str(get("dtype", "auto")),
        max_model_len=number("max_model_len", None, int, 16),
        gpu_memory_utilization=utilization,
        max_new_tokens=number("max_new_tokens", 16, int, 1),
        scorer=scorer,
        seed=number("seed", 0, int, 0),
        trust_remote_code=spec.flag_option("trust_remote_code"),
    )



class VLLMHost(ModelHost):
    def __init__(self, spec: ModelSpec, llm: Any, sampling_params_cls: Any, options: VLLMOptions) -> None:
        self.spec = spec
        self.llm = llm
        self.SamplingParams = sampling_params_cls
        self.options = options
        self.tokenizer = llm.get_tokenizer()
        self.calls = 0

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def loglikelihoods(self, pairs: list[tuple[str, str]]) -> tuple[list[float], list[int]]:
        sums, tokens, _ = self.loglikelihoods_greedy(pairs)
        return sums, tokens

    def loglikelihoods_greedy(self, pairs: list[tuple[str, str]]) -> tuple[list[float], list[int], list[bool | None]]:
        """Log-likelihoods, tokens, and whether each continuation is the greedy one (every token of rank 1; None
        where vLLM gives no rank)."""
        prompts, n_cont = [], []
        for context, continuation in pairs:
            # lm-eval's _encode_pair (shared by its vllm model): the context's trailing whitespace onto the continuation
            context, continuation = whitespace_onto_continuation(context, continuation)
            ctx, whole = self._encode(context), self._encode(context + continuation)
            cont = whole[len(ctx):] if whole[: len(ctx)] == ctx and len(whole) > len(ctx) else self._encode(continuation)
            tokens = ctx + cont
            prompts.append({"prompt_token_ids": tokens})
            n_cont.append(min(len(cont), len(tokens) - 1))
        params = self.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        sums, greedy = [], []
        for out, prompt, n in zip(outputs, prompts, n_cont):
            ids = prompt["prompt_token_ids"]
            # prompt_logprobs[j] maps token ids to Logprob objects for position j (None at j = 0)
            total, ranks = 0.0, []
            for j in range(len(ids) - n, len(ids)):
                entry = out.prompt_logprobs[j][ids[j]]
                total += float(entry.logprob)
                ranks.append(getattr(entry, "rank", None))
            sums.append(total)
            greedy.append(None if any(r is None for r in ranks) else all(r == 1 for r in ranks))
        return sums, [len(p["prompt_token_ids"]) for p in prompts], greedy

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[str], list[int]]:
        """Greedy completions at each request's stop strings and budget (vLLM leaves the stop string out; the text
        is cut at the first stop string as lm-eval does for an lm-eval item)."""
        params = [self.SamplingParams(max_tokens=r.max_tokens, temperature=0.0, stop=[u for u in r.until if u] or None)
                  for r in requests]
        outputs = self.llm.generate([r.prompt for r in requests], params, use_tqdm=False)
        texts = [cut_at_stop(out.outputs[0].text, r) for out, r in zip(outputs, requests)]
        used = [len(out.prompt_token_ids) + len(out.outputs[0].token_ids) for out in outputs]
        return texts, used

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        if not items:
            return []
        t0 = time.perf_counter()
        fields = [k for k, v in items[0].items() if not sc._is_missing(v)]
        scorer = sc.resolve_scorer(self.options.scorer, fields, source=f"item {items[0].get('item_id')!r}")
        for item in items:
            scorer.check_item(item)
        if scorer.kind == sc.LOGLIK:
            requests = [sc.mc_request(item) for item in items]
            logliks, tokens, greedy = self.loglikelihoods_greedy([(c, x) for c, xs in requests for x in xs])
            outputs, used, resps, pos = [], [], [], 0
            for _, conts in requests:
                outputs.append(logliks[pos:pos + len(conts)])
                used.append(sum(tokens[pos:pos + len(conts)]))
                resps.append([[ll, g] for ll, g in zip(logliks[pos:pos + len(conts)], greedy[pos:pos + len(conts)])])
                pos += len(conts)
        else:
            outputs, used = self.generate(sc.generation_requests(items, self.options.max_new_tokens))
            resps = [None] * len(items)
        share = (time.perf_counter() - t0) / len(items)
        return [{"item_id": str(item["item_id"]), "score": sc.judge(scorer, out, item), "tokens": int(n),
                 "latency_s": share, "output": sc.output_text(out, item), **({"resps": r} if r is not None else {})}
                for item, out, n, r in zip(items, outputs, used, resps)]

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec.text, "kind": "vllm", **self.options.llm_kwargs(),
                "scorer": self.options.scorer or "auto"}

    def close(self) -> None:
        self.llm = None


def build_host(spec: ModelSpec, *, cache_dir: str | None = None, **kwargs: Any) -> VLLMHost:
    options = parse_options(spec, **kwargs)
    try:
        from vllm import LLM, SamplingParams  # lazy: optional extra, GPU only
    except Exception:  # ImportError, or a CPU-only install failing inside vLLM's own imports
        raise InputError(NOT_INSTALLED) from None
    location = spec.location
    if location.startswith("bundled:"):
        from certeval.inputs.smollm import resolve_model_dir

        location = str(resolve_model_dir(location, cache_dir))
    llm = LLM(model=location, **options.llm_kwargs())
    return VLLMHost(spec, llm, SamplingParams, options)
