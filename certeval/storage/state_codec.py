"""A method state as stored: large per-item arrays by content hash in ``features/``, long float logs packed;
:class:`StateArrays` writes and reads them for a run folder."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
from typing import Any

import numpy as np

from certeval.errors import InputError

from .io import Folder, _damaged, _first

REFS_DIR = "features"  # per-item constant arrays of a run's method states, one file per content hash
REF_KEY = "features_ref"
REF_MIN_VALUES = 256  # smaller arrays stay inline (a reference and a file would cost more than they save)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def array_digest(arr: np.ndarray) -> str:
    """sha256 of an array's dtype, shape and C-order bytes: the name of its file under ``features/``."""
    arr = np.ascontiguousarray(arr)
    digest = hashlib.sha256(f"{arr.dtype.str}{list(arr.shape)}|".encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


def _swap_state_arrays(state: Any, fn: Any) -> Any:
    """A copy of a stored state (``{"round", "method_state", "decision"}``) with ``fn`` applied to each value
    that is the same at every round of a run: the bank's ``features`` and ``subsets``, its history prior's
    ``item_mean`` and ``factors`` (both sides of a pair prior) and the method's feature ``strata``. Only the
    dicts on the way are copied; anything else is returned as it is."""
    if not isinstance(state, dict) or not isinstance(state.get("method_state"), dict):
        return state
    method = dict(state["method_state"])

    def history(h: Any) -> Any:
        if not isinstance(h, dict):
            return h
        h = dict(h)
        if h.get("pair"):
            for side in ("a", "b"):
                h[side] = history(h.get(side))
            return h
        for key in ("item_mean", "factors"):
            if key in h:
                h[key] = fn(h[key])
        return h

    if isinstance(method.get("bank"), dict):
        bank = dict(method["bank"])
        for key in ("features", "subsets"):
            if key in bank:
                bank[key] = fn(bank[key])
        if "history" in bank:
            bank["history"] = history(bank["history"])
        method["bank"] = bank
    if isinstance(method.get("extra"), dict) and "strata" in method["extra"]:
        method["extra"] = {**method["extra"], "strata": fn(method["extra"]["strata"])}
    return {**state, "method_state": method}


FLOATS_KEY = "f64"
FLOATS_MIN = 64  # shorter float lists stay as JSON numbers


def _swap_float_logs(state: Any, fn: Any) -> Any:
    """A copy of a stored state with ``fn`` applied to the method's absorbed ``scores`` and to each value of
    its ``extra`` (draw logs, running statistics: what grows round by round)."""
    if not isinstance(state, dict) or not isinstance(state.get("method_state"), dict):
        return state
    method = dict(state["method_state"])
    if "scores" in method:
        method["scores"] = fn(method["scores"])
    if isinstance(method.get("extra"), dict):
        method["extra"] = {k: fn(v) for k, v in method["extra"].items()}
    return {**state, "method_state": method}


def _pack_floats(value: Any) -> Any:
    """A 1-D or 2-D list of floats (None for a non-finite value, as strict JSON stores it) as base64 of its
    little-endian float64 bytes, when that is shorter than the JSON numbers (10.7 characters a value against
    ~19 for a float's shortest repr); anything else as it is."""
    if not isinstance(value, list) or len(value) < FLOATS_MIN:
        return value
    rows = value if all(isinstance(v, list) for v in value) else None
    flat = [x for row in rows for x in row] if rows is not None else value
    if not flat or not all(type(x) is float or x is None for x in flat):
        return value
    if rows is not None and len({len(row) for row in rows}) != 1:
        return value
    arr = np.array([np.nan if x is None else x for x in flat], dtype="<f8")
    text = base64.b64encode(arr.tobytes()).decode("ascii")
    if len(text) + 40 >= len(json.dumps(value, separators=(",", ":"), allow_nan=False)):
        return value
    shape = [len(rows), len(rows[0])] if rows is not None else [len(flat)]
    return {FLOATS_KEY: text, "shape": shape}


def _unpack_floats(value: Any, where: str) -> Any:
    """Inverse of :func:`_pack_floats` (non-finite values back to None, as the JSON numbers would read)."""
    if not (isinstance(value, dict) and set(value) == {FLOATS_KEY, "shape"}):
        return value
    try:
        arr = np.frombuffer(base64.b64decode(value[FLOATS_KEY], validate=True), dtype="<f8")
        arr = arr.reshape([int(n) for n in value["shape"]])
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InputError(f"{where} is damaged (a packed float list does not decode: {_first(exc)}); start a new "
                         "--run-id or restore the file") from None
    clean = np.where(np.isfinite(arr), arr, np.nan).tolist()
    if arr.ndim == 1:
        return [None if x != x else x for x in clean]
    return [[None if x != x else x for x in row] for row in clean]


class StateArrays:
    """Per-item constant arrays of a run's states, stored once under ``features/<sha256>.npy`` (atomic, never
    rewritten) and named in the state by ``{"features_ref": <sha256>, "shape", "dtype"}`` instead of inline:
    384-d embeddings of 567 items were 4.5 MB of JSON per model and round. A state written before (arrays
    inline) reads as it always did."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder
        self._written: set[str] = set()
        self._read: dict[str, np.ndarray] = {}

    def slim(self, state: Any) -> Any:
        """The state to write: large constant arrays replaced by references (their files written once), long
        float logs packed."""
        return _swap_float_logs(_swap_state_arrays(state, self._put), _pack_floats)

    def _put(self, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            return value
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged: not an array
            return value
        if arr.dtype.kind not in "iuf" or arr.size < REF_MIN_VALUES:
            return value
        arr = arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64)
        sha = array_digest(arr)
        if sha not in self._written:
            rel = f"{REFS_DIR}/{sha}.npy"
            if not self.folder.exists(rel):  # content-named: an existing file already holds these bytes
                sink = io.BytesIO()
                np.save(sink, arr, allow_pickle=False)
                self.folder.write_bytes(rel, sink.getvalue())
            self._written.add(sha)
        return {REF_KEY: sha, "shape": list(arr.shape), "dtype": arr.dtype.str}

    def resolve(self, state: Any, where: str = "the state") -> Any:
        """The state as the method wrote it: every reference replaced by its array (as nested lists)."""
        def get(value: Any) -> Any:
            if not (isinstance(value, dict) and REF_KEY in value):
                return value
            return self._get(value, where).tolist()

        state = _swap_float_logs(state, lambda v: _unpack_floats(v, where))
        return _swap_state_arrays(state, get)

    def _get(self, ref: dict, where: str) -> np.ndarray:
        sha = ref.get(REF_KEY)
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise self._damaged(f"{where} holds a malformed array reference {sha!r}")
        if sha in self._read:
            return self._read[sha]
        rel = f"{REFS_DIR}/{sha}.npy"
        raw = self.folder.read_bytes(rel)
        if raw is None:
            raise self._damaged(f"{rel}, named by {where}, is missing")
        try:
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise self._damaged(f"{rel} is not a readable array ({_first(exc)})") from None
        if array_digest(arr) != sha or ("shape" in ref and list(arr.shape) != list(ref["shape"])):
            raise self._damaged(f"{rel} differs from what was written (its content hash does not match)")
        self._read[sha] = arr
        return arr

    def _damaged(self, what: str) -> InputError:
        return _damaged(self.folder, what)
