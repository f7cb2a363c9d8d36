"""One model-host interface for every backend (replay, hf, vllm, openai).

A host scores a batch of bank items and returns, per item, the score in [0, 1]
plus tokens used and latency. Hosts are plain Python classes so they can be
tested in-process; the pipeline runs them inside long-lived Ray actors. What a spec names
(``replay:…``, ``hf:…``, ``vllm:…``, ``openai:…``) is parsed in :mod:`certeval.inputs.model_spec`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

from certeval.inputs.model_spec import ModelSpec, parse_model_spec


class ModelHost(ABC):
    """Scores batches of items. Items are dicts holding ``item_id`` and the bank's prompt fields."""

    spec: ModelSpec

    @abstractmethod
    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return one dict per item: ``item_id``, ``score`` (float in [0, 1]), ``tokens`` (int), ``latency_s``."""

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec.text, "kind": self.spec.kind}

    def close(self) -> None:  # noqa: B027 - a no-op unless a host holds something
        """Release resources (GPU memory, server connections)."""


_HOST_MODULES = {"replay": "replay", "hf": "hf", "vllm": "vllm_host", "openai": "openai_host"}
_CACHING_KINDS = ("hf", "vllm")  # hosts that may convert a bundled model into the cache folder


def make_host(spec: ModelSpec | str, *, cache_dir: str | None = None, **kwargs: Any) -> ModelHost:
    """Build the in-process host for a spec (the pipeline wraps it in a Ray actor). ``cache_dir``: where a
    bundled model's converted copy is kept (``RuntimeOptions.cache_dir``; None: the default folder)."""
    if isinstance(spec, str):
        spec = parse_model_spec(spec)
    module = importlib.import_module(f"{__package__}.{_HOST_MODULES[spec.kind]}")
    if spec.kind in _CACHING_KINDS:
        kwargs["cache_dir"] = cache_dir
    return module.build_host(spec, **kwargs)
