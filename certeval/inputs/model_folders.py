"""A local model folder (``hf:DIR``, ``vllm:DIR``, ``select --checkpoints``) read as data before any model loads.

Its ``config.json`` must be a readable regular file holding a JSON object (transformers reads nothing else); a
folder whose config or tokenizer config asks for the model's own code (``auto_map``, transformers' custom classes
that ``trust_remote_code`` would import from the folder) is refused unless the user passed ``--trust-remote-code``
(issue 48): loading it runs Python that came with the checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from certeval.errors import InputError

MAX_CONFIG_BYTES = 16 << 20  # a model's config.json is kilobytes; anything this large is not one
CUSTOM_CODE_KEYS = ("auto_map",)  # transformers' pointer to classes defined in the folder's own .py files
TRUST_FLAG = "--trust-remote-code"


def _read_object(path: Path, flag: str, value: str, *, required: bool) -> dict | None:
    what = path.name
    try:
        st = path.stat()
    except FileNotFoundError:
        if not required:
            return None
        hint = " (a link to nothing)" if path.is_symlink() else ""
        raise InputError(f"{flag} {value!r}: {str(path.parent)!r} is not a model folder: it has no readable "
                         f"{what}{hint}") from None
    except OSError as exc:
        raise InputError(f"{flag} {value!r}: {str(path)!r} cannot be read ({exc.strerror})") from None
    if not path.is_file():
        raise InputError(f"{flag} {value!r}: {str(path)!r} is not a file, so {str(path.parent)!r} has no readable "
                         f"{what}")
    if st.st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{flag} {value!r}: {str(path)!r} declares {st.st_size} bytes, over the "
                         f"{MAX_CONFIG_BYTES} a model config is read with")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{flag} {value!r}: {str(path)!r} cannot be read ({exc.strerror})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{flag} {value!r}: {str(path)!r} is not JSON ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'empty'})") from None
    if not isinstance(data, dict):
        raise InputError(f"{flag} {value!r}: {str(path)!r} holds a JSON {type(data).__name__}, not an object "
                         "(not a model config)")
    return data


def read_model_config(folder: str | Path, flag: str, value: str) -> dict[str, Any]:
    """``folder/config.json`` as a JSON object; InputError naming ``flag`` and ``value`` otherwise."""
    return _read_object(Path(folder) / "config.json", flag, value, required=True)


def custom_code(folder: str | Path, flag: str, value: str) -> str | None:
    """Where the folder asks for its own code (``config.json: auto_map``...), or None."""
    folder = Path(folder)
    for name in ("config.json", "tokenizer_config.json", "processor_config.json"):
        data = _read_object(folder / name, flag, value, required=name == "config.json")
        if data is None:
            continue
        for key in CUSTOM_CODE_KEYS:
            if data.get(key):
                return f"{name}: {key}"
    return None


def check_model_folder(folder: str | Path, flag: str, value: str, *, trust_remote_code: bool = False) -> dict:
    """The checks of a local model folder (module docstring); returns its config."""
    path = Path(os.path.expanduser(str(folder)))
    if not path.exists():
        raise InputError(f"{flag} {value!r}: {str(path)!r} does not exist")
    if not path.is_dir():
        raise InputError(f"{flag} {value!r}: {str(path)!r} is a file, not a model folder")
    config = read_model_config(path, flag, value)
    asks = custom_code(path, flag, value)
    if asks and not trust_remote_code:
        raise InputError(f"{flag} {value!r}: {str(path)!r} asks to run its own code ({asks}); certeval loads it "
                         f"only with {TRUST_FLAG} (the code comes with the checkpoint and runs as you)")
    return config
