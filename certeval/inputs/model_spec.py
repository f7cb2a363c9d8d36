"""What a model spec names, read before any model loads (docs/architecture.md §4)::

    replay:<scores file>#<model>        recorded scores (bundled:<name> works as the file)
    hf:<path or bundled:smollm2>        transformers on CPU or CUDA
    vllm:<path>                         vLLM on GPU (optional extra, imported lazily)
    openai:<base_url>#<model>           any OpenAI-compatible endpoint
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from certeval.errors import InputError

KINDS = ("replay", "hf", "vllm", "openai")


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``kind:location[#name]`` model spec; ``options`` come from ``?k=v&...``."""

    kind: str
    location: str
    name: str | None = None
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    text: str = ""

    @property
    def label(self) -> str:
        """Short, stable display name (model name, else the path's last part)."""
        if self.name:
            return self.name
        return self.location.rstrip("/").split("/")[-1] or self.location

    def option(self, key: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == key:
                return v
        return default

    def flag_option(self, key: str) -> bool:
        """Option ``key`` as a yes/no flag (true/false, 1/0, yes/no); absent is false."""
        value = str(self.option(key, "false")).strip().lower()
        if value not in ("true", "false", "1", "0", "yes", "no"):
            raise InputError(f"model spec option {key}={value!r} in {self.text!r} must be true or false")
        return value in ("true", "1", "yes")

    def number_option(self, key: str, default: Any, cast: type = int, low: float = 1) -> Any:
        """Option ``key`` (else ``default``) as ``cast``, at least ``low``; ``None`` stays ``None``."""
        value = self.option(key, default)
        if value is None:
            return None
        kind = "an integer" if cast is int else "a number"
        try:
            out = cast(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"model spec option {key}={value!r} in {self.text!r} must be {kind}") from None
        if not math.isfinite(out):  # nan passes every comparison, inf every lower bound
            raise InputError(f"model spec option {key}={value!r} in {self.text!r} must be a finite number")
        if out < low:
            raise InputError(f"model spec option {key}={out} in {self.text!r} must be >= {low}")
        return out


# what a spec's syntax reserves in a location (the name after '#', options after '?') and the escape that stands for
# it; '%' itself too, so that any folder name can be written. openai: the location is a URL, escaped as URLs are.
LOCATION_ESCAPES = {"%": "%25", "#": "%23", "?": "%3F"}
_UNESCAPE = re.compile("|".join(LOCATION_ESCAPES.values()), re.IGNORECASE)


def quote_location(path: str) -> str:
    """``path`` as a spec's location: ``%``, ``#`` and ``?`` written ``%25``, ``%23``, ``%3F`` (a checkpoint folder
    named ``run#3?`` is ``hf:/ckpts/run%233%3F``)."""
    return "".join(LOCATION_ESCAPES.get(c, c) for c in path)


def _unquote_location(location: str) -> str:
    back = {v.upper(): k for k, v in LOCATION_ESCAPES.items()}
    return _UNESCAPE.sub(lambda m: back[m.group(0).upper()], location)


def parse_model_spec(text: str) -> ModelSpec:
    """Parse a model spec; raise :class:`InputError` naming the spec when it is malformed."""
    if not isinstance(text, str) or ":" not in text:
        raise InputError(f"model spec must look like KIND:LOCATION (kinds: {', '.join(KINDS)}); got {text!r}")
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise InputError(f"unknown model spec kind {kind!r} in {text!r}; kinds: {', '.join(KINDS)}")
    options: list[tuple[str, str]] = []
    if "?" in rest:
        rest, _, query = rest.partition("?")
        for part in filter(None, query.split("&")):
            if "=" not in part:
                raise InputError(f"model spec option {part!r} in {text!r} must look like key=value")
        # percent-decoding as in any URL query (a value may hold '&', '=' or '#' written as %26, %3D, %23)
        options = parse_qsl(query, keep_blank_values=True)
        keys = [k for k, _ in options]
        twice = next((k for k in keys if keys.count(k) > 1), None)
        if twice is not None:
            raise InputError(f"--model {text!r} gives option {twice!r} twice; give each option once")
    location, _, name = rest.partition("#")  # openai:http://127.0.0.1:8000/v1#model: the URL holds ':' itself
    if not location:
        raise InputError(f"model spec {text!r} has no location after {kind}:")
    if kind in ("replay", "openai") and not name:
        raise InputError(f"model spec {text!r} needs a model name after '#'")
    if kind != "openai":
        location = _unquote_location(location)
    return ModelSpec(kind, location, name or None, tuple(options), text)
