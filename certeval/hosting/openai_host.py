"""OpenAI-compatible host (``openai:<base_url>#<model>``) on httpx (one keep-alive connection pool per host,
shared by its request threads) with tenacity's retries (exponential back-off; a 4xx other than 429 is never
retried: the request itself is wrong).

Options: ``?concurrency=4&max_new_tokens=16&timeout=60&scorer=NAME&mc=generate|echo
&api_key_env=OPENAI_API_KEY&retries=2``.

Generation uses ``POST {base_url}/completions`` with ``temperature=0`` and ``stop=["\\n"]``.
Multiple choice by log-likelihood needs the legacy completions ``echo=true`` + ``logprobs``
(the prompt's own token log-probabilities, OpenAI's original API, also served by vLLM): with
``mc=echo`` the score of a choice is the sum of the log-probs of the tokens at or after the end
of the context. It is opt-in because servers differ: llama-cpp-python 0.3.36 (``--logits_all
true``) answers echo requests, but its ``token_logprobs[i]`` is token i scored under the
distribution for position i+1 (checked against its own ``top_logprobs``), i.e. shifted by one.
The default ``mc=generate`` lists the choices as ``A. …`` and takes the reply's letter or choice
text as the model's pick (no recognisable pick scores 0).
Requests of a call run concurrently (``concurrency`` threads) so a batch keeps the server busy.
"""

from __future__ import annotations

import math
import os
import string
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from certeval.errors import InputError
from certeval.inputs.model_spec import ModelSpec
from certeval.runtime.redact import redact
from certeval.scoring import scorers as sc
from certeval.scoring.lm_eval_generation import GenerationRequest, cut_at_stop

from .base import ModelHost

_KNOWN = {"concurrency", "max_new_tokens", "timeout", "scorer", "mc", "api_key_env", "retries"}


class EndpointError(RuntimeError):
    """The endpoint answered with an error or not at all (after retries)."""


class _Transient(Exception):
    """A failure worth retrying: no answer, a 5xx, or 429 (rate limited)."""


@dataclass(frozen=True)
class OpenAIOptions:
    """How an OpenAI-compatible host calls its endpoint (the spec's ``?key=value`` options, :func:`parse_options`).
    ``key_env``: the variable the API key comes from, named in messages, never its value."""

    concurrency: int = 4
    max_new_tokens: int = 16
    timeout: float = 60.0
    scorer: str | None = None
    mc_mode: str = "generate"
    key_env: str = "OPENAI_API_KEY"
    retries: int = 2


class OpenAIHost(ModelHost):
    def __init__(self, spec: ModelSpec, options: OpenAIOptions | None = None, *, api_key: str | None = None) -> None:
        options = options or OpenAIOptions()
        self.spec = spec
        self.base_url = spec.location.rstrip("/")
        self.model = spec.name
        self.concurrency = options.concurrency
        self.max_new_tokens = options.max_new_tokens
        self.timeout = options.timeout
        self.scorer_name = options.scorer
        self.mc_mode = options.mc_mode
        self.api_key = api_key
        self.key_env = options.key_env
        self.retries = options.retries
        self.calls = 0
        self.client_: httpx.Client | None = None
        if options.scorer is not None:
            sc.get_scorer(options.scorer)

    # -------------------------------------------------------------- HTTP

    def _client(self) -> httpx.Client:
        if self.client_ is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self.client_ = httpx.Client(timeout=self.timeout, headers=headers,
                                        limits=httpx.Limits(max_connections=self.concurrency))
        return self.client_

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{path}"

        def once() -> dict[str, Any]:
            try:
                response = self._client().post(url, json=payload)
            except httpx.TransportError as exc:  # refused, reset, timed out
                raise _Transient(self._scrub(f"{type(exc).__name__}: {exc}")) from None
            if response.status_code >= 400:  # the body may echo the key (a 401 quoting the header it got)
                error = self._scrub(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
                if response.status_code < 500 and response.status_code != 429:
                    raise EndpointError(error)
                raise _Transient(error)
            return response.json()

        try:
            for attempt in Retrying(stop=stop_after_attempt(self.retries + 1), reraise=True,
                                    wait=wait_exponential(multiplier=0.5, max=8.0),
                                    retry=retry_if_exception_type(_Transient)):
                with attempt:
                    return once()
        except _Transient as exc:
            raise EndpointError(f"{url} failed after {self.retries + 1} tries: {exc}") from None
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    def _scrub(self, text: str) -> str:
        """``text`` without the key (and any other secret): what leaves this host never carries it, so neither a
        message, Ray's logs, Prefect's records nor the run folder can (issue 48)."""
        return redact(text, self.api_key)

    def ping(self) -> None:
        """Fail with :class:`InputError` when the endpoint is unreachable (``GET {base_url}/models``) or refuses the
        key (401/403: the variable is named, never its value, nor the answer that may echo it)."""
        try:
            response = self._client().get(f"{self.base_url}/models", timeout=min(self.timeout, 10.0))
        except httpx.TransportError as exc:  # any other HTTP answer will do: some servers have no /models route
            raise InputError(self._scrub(f"openai endpoint {self.base_url!r} is unreachable: "
                                         f"{type(exc).__name__}: {exc}")) from None
        if response.status_code in (401, 403):
            held = f"the key in ${self.key_env}" if self.api_key else f"no key (${self.key_env} is not set)"
            raise InputError(f"openai endpoint {self.base_url!r} answered HTTP {response.status_code} to {held} "
                             f"(GET /models); set api_key_env=NAME to the variable holding a valid key")

    def complete(self, prompt: str, request: GenerationRequest | None = None) -> tuple[str, int]:
        """A greedy completion: at a newline within ``max_new_tokens``, or at the request's own stop strings and
        budget (an lm-eval item; the text cut at the first stop string as lm-eval does)."""
        request = request or GenerationRequest(prompt, ("\n",), self.max_new_tokens, False)
        stops = [u for u in request.until if u]
        out = self._post("/completions", {"model": self.model, "prompt": request.prompt,
                                          "max_tokens": request.max_tokens, "temperature": 0.0,
                                          **({"stop": stops} if stops else {})})
        text = cut_at_stop(out["choices"][0].get("text", ""), request)
        usage = out.get("usage") or {}
        return text, int(usage.get("total_tokens", 0))

    def prompt_loglik(self, context: str, continuation: str) -> tuple[float, int]:
        """Sum of log-probs of the continuation's tokens, from ``echo`` + ``logprobs`` (no new token)."""
        out = self._post("/completions", {"model": self.model, "prompt": context + continuation, "max_tokens": 1,
                                          "temperature": 0.0, "echo": True, "logprobs": 1})
        logprobs = out["choices"][0].get("logprobs") or {}
        offsets = logprobs.get("text_offset")
        token_lps = logprobs.get("token_logprobs")
        if not offsets or not token_lps:
            raise EndpointError("the endpoint returned no prompt log-probabilities for echo=true")
        total, seen = 0.0, 0
        # The echo covers the prompt and then the one generated token; only prompt tokens count.
        prompt_end = len(context) + len(continuation)
        for offset, lp in zip(offsets, token_lps):
            if offset >= prompt_end:
                break
            if offset >= len(context) and lp is not None:
                total += float(lp)
                seen += 1
        if seen == 0:
            raise EndpointError("the endpoint's echoed tokens do not cover the continuation")
        usage = out.get("usage") or {}
        return total, int(usage.get("total_tokens", 0))

    # -------------------------------------------------------------- multiple choice

    def _mc_by_generation(self, item: dict[str, Any]) -> tuple[list[float] | None, int, str]:
        choices = [str(c) for c in sc.as_list(item.get("choices"))]
        letters = string.ascii_uppercase[: len(choices)]
        question = str(item.get("prompt") or item.get("question"))
        listing = "\n".join(f"{letter}. {choice}" for letter, choice in zip(letters, choices))
        text, tokens = self.complete(f"Question: {question}\n{listing}\nAnswer:")
        reply = sc.extract_answer(text)
        pick = None
        head = reply.strip().rstrip(".):").upper()
        if head in letters and head:
            pick = letters.index(head)
        else:
            normalized = sc.normalize_answer(reply)
            matches = [i for i, c in enumerate(choices) if sc.normalize_answer(c) == normalized]
            pick = matches[0] if matches else None
        if pick is None:
            return None, tokens, reply
        return [0.0 if i == pick else float("-inf") for i in range(len(choices))], tokens, reply

    def _score_mc(self, item: dict[str, Any], scorer: sc.Scorer) -> tuple[float, int, str]:
        context, continuations = sc.mc_request(item)
        if self.mc_mode == "echo":
            results = [self.prompt_loglik(context, cont) for cont in continuations]
            logliks = [lp for lp, _ in results]
            return sc.judge(scorer, logliks, item), sum(t for _, t in results), sc.output_text(logliks, item)
        logliks, tokens, reply = self._mc_by_generation(item)
        if logliks is None:
            return 0.0, tokens, reply
        return sc.judge(scorer, logliks, item), tokens, sc.output_text(logliks, item)

    def _score_one(self, item: dict[str, Any], scorer: sc.Scorer) -> dict[str, Any]:
        t0 = time.perf_counter()
        if scorer.kind == sc.LOGLIK:
            score, tokens, output = self._score_mc(item, scorer)
        else:
            request = sc.generation_requests([item], self.max_new_tokens)[0]
            text, tokens = self.complete(request.prompt, request)
            score, output = sc.judge(scorer, text, item), sc.output_text(text, item)
        if isinstance(output, str):  # judged as answered; kept without the key should the reply quote it
            output = self._scrub(output)
        return {"item_id": str(item["item_id"]), "score": score, "tokens": tokens,
                "latency_s": time.perf_counter() - t0, "output": output}

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        if not items:
            return []
        fields = [k for k, v in items[0].items() if not sc._is_missing(v)]
        scorer = sc.resolve_scorer(self.scorer_name, fields, source=f"item {items[0].get('item_id')!r}")
        for item in items:
            scorer.check_item(item)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda item: self._score_one(item, scorer), items))

    def close(self) -> None:
        if self.client_ is not None:
            self.client_.close()
            self.client_ = None

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec.text, "kind": "openai", "base_url": self.base_url, "model": self.model,
                "mc": self.mc_mode}


def _positive(spec: ModelSpec, key: str, value: Any, cast: type = int) -> Any:
    try:
        out = cast(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"model spec option {key}={value!r} in {spec.text!r} must be a number") from None
    if not math.isfinite(out) or out <= 0:
        raise InputError(f"model spec option {key}={value!r} in {spec.text!r} must be a positive finite number")
    return out


def parse_options(spec: ModelSpec, **kwargs: Any) -> OpenAIOptions:
    """Validation step for an openai spec (URL and options), run by the plan before Ray starts and by the host."""
    unknown = [k for k, _ in spec.options if k not in _KNOWN]
    if unknown:
        raise InputError(f"unknown openai option {unknown[0]!r} in {spec.text!r}; options: {', '.join(sorted(_KNOWN))}")
    if not spec.location.startswith(("http://", "https://")):
        raise InputError(f"openai model spec {spec.text!r} needs an http(s) base URL, e.g. openai:http://127.0.0.1:8000/v1#model")
    from urllib.parse import urlsplit

    if "@" in urlsplit(spec.location).netloc:  # user:key@host would be stored with the run, and echoed
        raise InputError(f"openai model spec for {spec.name!r}: the base URL holds credentials (user:key@host); "
                         "give the key by api_key_env=NAME (an environment variable) instead")
    mc_mode = str(spec.option("mc", kwargs.get("mc", "generate")))
    if mc_mode not in ("echo", "generate"):
        raise InputError(f"model spec option mc={mc_mode!r} in {spec.text!r} must be generate or echo")
    default = OpenAIOptions()
    return OpenAIOptions(
        concurrency=spec.number_option("concurrency", kwargs.get("concurrency", default.concurrency)),
        max_new_tokens=spec.number_option("max_new_tokens", kwargs.get("max_new_tokens", default.max_new_tokens)),
        timeout=_positive(spec, "timeout", spec.option("timeout", kwargs.get("timeout", default.timeout)), float),
        scorer=spec.option("scorer", kwargs.get("scorer")),
        mc_mode=mc_mode,
        key_env=str(spec.option("api_key_env", kwargs.get("api_key_env", default.key_env))),
        retries=spec.number_option("retries", kwargs.get("retries", default.retries), int, 0),
    )


def build_host(spec: ModelSpec, **kwargs: Any) -> OpenAIHost:
    options = parse_options(spec, **kwargs)
    from certeval.runtime.redact import register_secret_names

    register_secret_names([options.key_env])  # its value is a secret whatever the variable is called
    host = OpenAIHost(spec, options, api_key=os.environ.get(options.key_env))
    host.ping()
    return host
