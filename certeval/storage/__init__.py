"""Run folders on any fsspec URL (docs/architecture.md §5) and the per-model score cache.

Layout of one run::

    <root>/<run_id>/config.json          what was asked (compared on resume)
    <root>/<run_id>/rounds/<n>.parquet   model, item_id, score, output, prompt_hash, round, prob, look log
    <root>/<run_id>/state/<model>.json   method state after the last complete round (compact JSON)
    <root>/<run_id>/features/<sha256>.npy  per-item constant arrays of the states (embeddings, subset codes,
                                         history priors, strata), once per run, named by their content
    <root>/<run_id>/state/_run.json      the commit marker: last complete round + decisions
    <root>/<run_id>/results.json         estimates, intervals, decisions, ranking; lm-eval block
    <root>/<run_id>/manifest.json        each round file's size, sha256 and rows per model
    <root>/<run_id>/run.lock             held by the one process writing the run (see RunLock)
    <root>/<run_id>/logs/failure-*.log   the traceback of a runtime failure (exit 3)

and, shared by every run under the same root::

    <root>/_cache/<key>/meta.json        what the cache <key> holds (model spec, scorer, generation settings)
    <root>/_cache/_shared/parts/*.parquet  scores already paid for, one part per scored batch (column ``cache``),
                                         with the model's output and the item's prompt hash (null where
                                         there is none: replay models, parts written before they were kept),
                                         merged into one part when a folder holds more than MAX_PARTS

Every write is atomic: a local file is written under a temporary name in the
same folder and then renamed (``os.replace``); an object store receives one
PUT, which becomes visible only when complete. Nothing is ever half-written
under a final name, so a SIGKILL at any point leaves the folder readable.
State is JSON, never pickle.
"""

from __future__ import annotations

# by concept: io (filesystems, bounded calls, atomic writes), state_codec (states with arrays by reference),
# runstore (layout, manifest, RunStore), lock (one writer per run), cache (the shared score cache)
from .cache import ASKED_FIELDS, MAX_PARTS, PROMPT_FIELDS, ScoreCache, cache_key, compact_parts, item_key, prompt_hash
from .io import (
                 CACHE_DIR,
                 CALL_TIMEOUT_S,
                 DEFAULT_OUTPUT,
                 MAX_RECORD_BYTES,
                 MAX_TABLE_BYTES,
                 Folder,
                 bounded,
                 check_file,
                 check_folder,
                 check_reachable,
                 dumps,
                 filesystem,
                 is_local,
                 nearest_existing,
                 open_file,
                 parquet_bytes,
                 read_file,
                 safe_name,
                 set_max_file_bytes,
                 stage_file,
)
from .lock import LEASE_S, LOCK_NAME, STALE_LEASE_WAIT_S, RunLock, clean_temporaries
from .runstore import MANIFEST, RUN_MARKER, RunStore, round_name, verify_record
from .state_codec import REF_KEY, REFS_DIR, StateArrays, array_digest

__all__ = ["ASKED_FIELDS", "CACHE_DIR", "CALL_TIMEOUT_S", "DEFAULT_OUTPUT", "Folder", "MAX_RECORD_BYTES",
           "MAX_TABLE_BYTES", "LEASE_S", "LOCK_NAME", "MANIFEST",
           "MAX_PARTS", "PROMPT_FIELDS", "REFS_DIR", "REF_KEY", "RUN_MARKER", "RunLock", "RunStore", "STALE_LEASE_WAIT_S",
           "ScoreCache", "StateArrays", "array_digest", "bounded", "cache_key", "check_file", "check_folder", "check_reachable", "clean_temporaries",
           "compact_parts", "dumps", "filesystem", "is_local", "item_key", "nearest_existing", "open_file", "parquet_bytes",
           "prompt_hash", "read_file", "round_name", "safe_name", "set_max_file_bytes", "stage_file", "verify_record"]
