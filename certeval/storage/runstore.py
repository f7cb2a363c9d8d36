"""One run folder: its layout, the manifest of its rounds and the record check every reader makes
(:func:`verify_record`), and :class:`RunStore`."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import pandas as pd

from certeval.errors import InputError

from ..estimators.results import to_jsonable
from .cache import ScoreCache
from .io import CACHE_DIR, Folder, _damaged, dumps, filesystem, parquet_bytes, safe_name
from .lock import _HELD, STALE_LEASE_WAIT_S, RunLock, clean_temporaries
from .state_codec import StateArrays

RUN_MARKER = "state/_run.json"
MANIFEST = "manifest.json"  # rounds written: size, sha256 and rows per model of each (checked on resume)
MANIFEST_VERSION = 1


def round_name(n: int) -> str:
    return f"rounds/{n:05d}.parquet"


def _check_round(folder: Folder, n: int, entry: dict) -> None:
    """Round n's file is present and byte-identical (size, sha256) to what its manifest entry recorded."""
    data = folder.read_bytes(round_name(n))
    if data is None:
        raise _damaged(folder, f"{round_name(n)} is missing")
    if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise _damaged(folder, f"{round_name(n)} differs from what was written ({len(data)} bytes, "
                               f"{entry.get('bytes')} recorded)")


def verify_record(folder: Folder) -> None:
    """For readers of a stored run folder (rescore, ``--history``): every round its manifest lists is present and
    byte-identical, and no round file stands outside it (an edited, deleted or stray round is refused)."""
    manifest = folder.read_json(MANIFEST)
    files = {name for name in folder.list("rounds") if name.endswith(".parquet")}
    if manifest is None:
        if files:
            raise _damaged(folder, f"{MANIFEST} is missing while rounds/ holds files")
        return
    if not (isinstance(manifest, dict) and isinstance(manifest.get("rounds"), dict)):
        raise _damaged(folder, f"{MANIFEST} is not a manifest")
    listed = set()
    for key, entry in manifest["rounds"].items():
        if not (str(key).isdigit() and isinstance(entry, dict)):
            raise _damaged(folder, f"{MANIFEST} has an entry {key!r} that names no round")
        _check_round(folder, int(key), entry)
        listed.add(round_name(int(key)).split("/", 1)[1])
    stray = sorted(files - listed)
    if stray:
        raise _damaged(folder, f"rounds/{stray[0]} is not in {MANIFEST} (a round from elsewhere)")


@dataclass
class RunStore:
    """One run folder: config, rounds, method states, the commit marker and results."""

    output: str
    run_id: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", self.run_id or ""):
            raise InputError(f"--run-id must be 1-128 characters of letters, digits, '.', '_' or '-'; got {self.run_id!r}")
        fs, root = filesystem(self.output)
        self.root = Folder(fs, root)
        self.folder = Folder(fs, f"{root}/{self.run_id}")
        self.arrays = StateArrays(self.folder)

    @property
    def url(self) -> str:
        return self.folder.url()

    # -- config -----------------------------------------------------------
    def read_config(self) -> dict | None:
        return self.folder.read_json("config.json")

    def claim(self, config: dict, compare_keys: tuple[str, ...]) -> bool:
        """Write ``config`` for a new run, or check it against the stored one (resume).

        Returns True when the run was started by another command: the stored config's ``invocation`` differs
        from ``config``'s (a command that claims twice is not resuming). A stored config that differs in any of
        ``compare_keys`` is bad input: nothing is written.
        """
        took = self.acquire_lock(wait_s=STALE_LEASE_WAIT_S)  # held already when a CLI runs the flow
        try:
            stored = self.read_config()
            if stored is None:
                self.folder.write_json("config.json", config)
                return False
            for key in compare_keys:
                if to_jsonable(stored.get(key)) != to_jsonable(json.loads(dumps(config.get(key)))):
                    raise InputError(
                        f"run id {self.run_id!r} in {self.output!r} was started with {key}={stored.get(key)!r}, "
                        f"not {config.get(key)!r}; use another --run-id"
                    )
            return stored.get("invocation") is None or stored.get("invocation") != config.get("invocation")
        finally:  # the lock guards the check-and-write; whoever runs the rounds holds it on its own
            if took:
                self.release_lock()

    # -- rounds and state ---------------------------------------------------
    def write_round(self, n: int, frame: pd.DataFrame) -> None:
        """The round's Parquet file, then its manifest entry (size, sha256, rows per model)."""
        data = parquet_bytes(frame)
        self.folder.write_bytes(round_name(n), data)
        manifest = self.read_manifest() or {"version": MANIFEST_VERSION, "rounds": {}}
        rows = frame["model"].astype(str).value_counts() if len(frame) else pd.Series(dtype=int)
        manifest["rounds"][f"{n:05d}"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                          "rows": {str(k): int(v) for k, v in rows.items()}}
        self.folder.write_json(MANIFEST, manifest)

    def read_manifest(self) -> dict | None:
        manifest = self.folder.read_json(MANIFEST)
        if manifest is not None and not (isinstance(manifest, dict) and isinstance(manifest.get("rounds"), dict)):
            raise InputError(f"{self.folder.url(MANIFEST)} is damaged (not a manifest); nothing was changed — "
                             "start a new --run-id or restore the file")
        return manifest

    def verify_rounds(self, committed: int, scored: dict[str, tuple[int, int]], *, may_leave: bool = False) -> None:
        """Refuse to resume from a record that differs from what was written.

        ``committed``: rounds ``0 .. committed - 1`` are closed for every model; each must be in the manifest,
        present, and byte-identical (sha256). ``scored[label] = (n, upto)``: the model's stored state says it
        absorbed ``n`` items in rounds ``0 .. upto - 1``, which must equal its recorded rows there (a raised or
        lowered round counter, a swapped or edited state file). ``may_leave``: paired runs, where a model leaves
        once its place is settled: its rows then fill a prefix of those rounds (none after it left).
        """
        manifest = self.read_manifest()
        if manifest is None:
            if any(name.endswith(".parquet") for name in self.folder.list("rounds")):
                raise self._damaged(f"{MANIFEST} is missing while rounds/ holds files")
            manifest = {"rounds": {}}
        entries = manifest["rounds"]
        for n in range(committed):
            entry = entries.get(f"{n:05d}")
            if entry is None:
                raise self._damaged(f"{MANIFEST} has no entry for {round_name(n)} (the states say it was committed)")
            _check_round(self.folder, n, entry)
        for label, (n_scored, upto) in scored.items():
            present = [int((entries.get(f"{n:05d}") or {}).get("rows", {}).get(label, 0)) > 0 for n in range(upto)]
            last = len(present) if not may_leave else (present.index(False) if False in present else len(present))
            for n in range(upto):  # a model takes part in every round until its last (or until it left)
                if present[n] != (n < last):
                    raise self._damaged(f"the state of {label!r} says round {upto - 1} was committed, but "
                                        f"{round_name(n)} holds {'no row' if n < last else 'rows'} of it")
            rows = sum(int(entries.get(f"{n:05d}", {}).get("rows", {}).get(label, 0)) for n in range(upto))
            if rows != n_scored:
                raise self._damaged(f"the state of {label!r} says {n_scored} items were scored, the committed "
                                    f"rounds hold {rows}")

    def verify_record(self) -> None:
        """For readers of a stored run (rescore, report): see :func:`verify_record`."""
        verify_record(self.folder)

    def _damaged(self, what: str) -> InputError:
        return _damaged(self.folder, what)

    def read_rounds(self, upto: int | None = None) -> pd.DataFrame:
        frames = []
        for name in self.folder.list("rounds"):
            if not name.endswith(".parquet"):
                continue
            n = int(name.split(".")[0])
            if upto is not None and n > upto:
                continue
            frames.append(self.folder.read_parquet(f"rounds/{name}"))
        if not frames:
            return pd.DataFrame(columns=["model", "item_id", "score", "round", "prob"])
        return pd.concat(frames, ignore_index=True)

    def write_state(self, label: str, state: dict) -> None:
        """``state/<model>.json``, compact, with the per-item constant arrays by reference (``features/``)."""
        self.folder.write_bytes(f"state/{safe_name(label)}.json", dumps(self.arrays.slim(state), compact=True))

    def write_states(self, states: dict[str, dict], threads: int = 8) -> None:
        """:meth:`write_state` of many models: encoded here, written concurrently (a ranking's end writes
        thousands; on an object store each write is a round trip)."""
        from concurrent.futures import ThreadPoolExecutor

        if len(states) <= 1:
            for label, state in states.items():
                self.write_state(label, state)
            return
        payloads = [(f"state/{safe_name(label)}.json", dumps(self.arrays.slim(state), compact=True))
                    for label, state in states.items()]
        with ThreadPoolExecutor(max_workers=min(threads, len(payloads))) as pool:
            list(pool.map(lambda p: self.folder.write_bytes(*p), payloads))

    def read_state(self, label: str) -> dict | None:
        rel = f"state/{safe_name(label)}.json"
        return self.arrays.resolve(self.folder.read_json(rel), rel)

    def commit_round(self, marker: dict) -> None:
        """The commit point of a round: written last, after its rounds file and every state."""
        self.folder.write_json(RUN_MARKER, marker)

    def read_marker(self) -> dict | None:
        return self.folder.read_json(RUN_MARKER)

    def write_results(self, results: dict) -> None:
        self.folder.write_json("results.json", results)

    def read_results(self) -> dict | None:
        return self.folder.read_json("results.json")

    # -- one writer -----------------------------------------------------------
    def acquire_lock(self, wait_s: float = 0.0) -> bool:
        """Take the run's writer lock (idempotent in this process); True when this call took it.

        A second process asking for the same run folder gets :class:`InputError` at once, or, on an object
        store, after waiting up to ``wait_s`` for the other writer's lease to end or expire."""
        key = self.folder.url()
        if key in _HELD:
            return False
        lock = RunLock(self.folder, self.run_id)
        lock.acquire(wait_s)
        _HELD[key] = lock
        if self.folder.local:
            clean_temporaries(self.folder.path, self.root.path)
        return True

    def release_lock(self) -> None:
        lock = _HELD.pop(self.folder.url(), None)
        if lock is not None:
            lock.release()

    def cache(self, key: str) -> ScoreCache:
        return ScoreCache(self.root.fs, f"{self.root.path}/{CACHE_DIR}/{key}")

    def cache_root(self) -> Folder:
        """``<root>/_cache``: the score caches of every run under this root."""
        return Folder(self.root.fs, f"{self.root.path}/{CACHE_DIR}")
