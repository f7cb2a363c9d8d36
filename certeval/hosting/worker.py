"""The body of one model actor (:class:`ModelWorker`): its hosts, score caches and call log; it ends with its
raylet. What it logs and where it caches come from its ``options`` argument, never from its environment."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import ray

from certeval.runtime.options import RuntimeOptions, runtime_options
from certeval.scoring.lm_eval_metrics import pack_output, unpack_output

CONTROL = "control"  # the actor's second thread: withdrawing batches sent ahead while one is being scored


def _ping_answer(ref: Any) -> dict[str, Any]:
    """An actor's answer to its start-up ``ping`` (already resolved): ``{pid, node_id}``, or ``{}`` when the
    actor died before answering."""
    try:
        return ray.get(ref, timeout=1)
    except Exception:  # the actor died before answering
        return {}


class ModelWorker:
    """The body of one actor: a host per model it serves (one, or every replay model of a file),
    their score caches and the call log."""

    def __init__(self, specs: dict[str, str], cache_urls: dict[str, str | None], options: RuntimeOptions | None,
                 host_kwargs: dict[str, Any] | None = None, secret_env: dict[str, str] | None = None,
                 threads: int | None = None) -> None:
        from certeval.runtime.startup import configure

        from .base import make_host

        os.environ.update(secret_env or {})  # before any host or filesystem reads its credentials
        if threads is not None:  # its CPUs per call it scores at once (a host's own threads= option still wins)
            set_torch_threads(threads)
        options = runtime_options(options)
        configure(options.startup_log)  # this actor's process: its first_call mark goes to the command's timeline
        from certeval.runtime.startup import mark

        mark("actor_started")  # the actor's process is up (Ray worker started, certeval imported): load begins
        loading = time.perf_counter()
        self.hosts = {label: make_host(text, cache_dir=options.cache_dir, **(host_kwargs or {}))
                      for label, text in specs.items()}
        self._by_spec = {specs[label]: host for label, host in self.hosts.items()}  # adopt(): kept actors
        self._adoptions = 0
        mark("model_loaded")  # every host built: the model is in memory
        self._load_s = time.perf_counter() - loading
        self.caches: dict[str, Any] = {}
        for label, url in cache_urls.items():
            if url:
                from certeval.storage import ScoreCache, filesystem

                self.caches[label] = ScoreCache(*filesystem(url))
        self.call_log = options.call_log
        self._first_call = True
        self._batch_lock = threading.Lock()
        self._started: set[str] = set()  # batch ids sent ahead that this actor began to score
        self._withdrawn: set[str] = set()  # batch ids withdrawn before they began: never scored
        self._scoring = 0  # score calls running now (a CPU-hosted model's actor runs several at once)
        self._most_at_once = 0
        _exit_with_raylet()

    def ping(self) -> dict[str, Any]:
        """Where this actor runs: its process and Ray node (the placement recorded in results.json)."""
        ctx = ray.get_runtime_context()
        load_s = self._load_s if self._adoptions <= 1 else 0.0  # an adopted actor's model was loaded before
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "torch_threads": _torch_threads(),
                "load_s": round(load_s, 3), "most_calls_at_once": self._most_at_once}

    def adopt(self, specs: dict[str, str], cache_urls: dict[str, str | None], options: RuntimeOptions | None,
              secret_env: dict[str, str] | None = None) -> dict[str, Any]:
        """A command takes this actor (kept alive by an earlier ``--keep-actors`` command, or just created): its
        labels, score caches, call log and start-up timeline replace the previous command's; the models stay
        loaded. Answers as :meth:`ping`, with ``reused`` (whether an earlier command had it)."""
        from certeval.runtime.startup import configure

        os.environ.update(secret_env or {})
        options = runtime_options(options)
        configure(options.startup_log)
        self.hosts = {label: self._by_spec[text] for label, text in specs.items()}
        self.caches = {}
        for label, url in cache_urls.items():
            if url:
                from certeval.storage import ScoreCache, filesystem

                self.caches[label] = ScoreCache(*filesystem(url))
        self.call_log = options.call_log
        self._first_call = True
        with self._batch_lock:
            self._started, self._withdrawn = set(), set()
        self._adoptions += 1
        return {**self.ping(), "reused": self._adoptions > 1}

    @ray.method(concurrency_group=CONTROL)
    def withdraw(self, batch_ids: list[str]) -> list[str]:
        """Of the batches sent ahead ``batch_ids``, those not yet begun: withdrawn (their ``score`` call returns
        None without scoring). A batch already begun runs to its end and is cached: the driver waits for it.
        Runs on the actor's control thread, so it answers while a batch is being scored. (``ray.cancel`` cannot
        stand in: on Ray 2.60 an actor call it reports cancelled, queued or begun, still runs and is cached.)"""
        with self._batch_lock:
            out = [b for b in batch_ids if b not in self._started]
            self._withdrawn.update(out)
        return out

    @ray.method(max_task_retries=0)  # a retried call could score a batch twice; lost batches are re-sent by the driver
    def score(self, parts: list[tuple[str, list[dict[str, Any]], list[str]]],
              resent: bool = False, batch_id: str | None = None) -> list[list[dict[str, Any]]] | None:
        """Score ``[(label, items, keys), ...]``; each part is cached before anything is returned.

        ``resent``: the batch was lost with another actor (e.g. its node died), which may have scored and
        cached part of it before dying; those items are answered from the cache, never scored again.
        ``batch_id``: a batch sent ahead; None (nothing scored) if it was withdrawn before it began.
        A CPU-hosted model's actor runs up to one call per CPU at once (``max_concurrency``,
        :meth:`certeval.hosting.pool_cpus.CpuPlan.calls_at_once`), each on its own thread.
        """
        with self._batch_lock:
            if batch_id is not None:
                if batch_id in self._withdrawn:
                    self._withdrawn.discard(batch_id)
                    return None
                self._started.add(batch_id)
            first, self._first_call = self._first_call, False
            self._scoring += 1
            self._most_at_once = max(self._most_at_once, self._scoring)
        try:
            if first:
                from certeval.runtime.startup import mark

                mark("first_call")
            return self._score(parts, resent)
        finally:
            with self._batch_lock:
                self._scoring -= 1

    def _score(self, parts: list[tuple[str, list[dict[str, Any]], list[str]]],
               resent: bool) -> list[list[dict[str, Any]]]:
        from certeval.storage import ScoreCache, prompt_hash

        out, paid_now, log = [], [], []
        for label, items, keys in parts:
            paid = self._cached_results(label, items, keys) if resent else {}
            todo = [(it, k) for it, k in zip(items, keys) if k not in paid]
            fresh = self.hosts[label].score([it for it, _ in todo]) if todo else []
            if len(fresh) != len(todo):
                raise RuntimeError(f"host for {label!r} returned {len(fresh)} results for {len(todo)} items")
            cache = self.caches.get(label)
            if cache is not None and fresh:
                rows = [{**{c: r.get(c) for c in ScoreCache.COLUMNS if c != "item_key"}, "item_key": k,
                         "prompt_hash": prompt_hash(it)} for r, (it, k) in zip(fresh, todo)]
                for row, r in zip(rows, fresh):
                    row["tokens"] = int(row["tokens"] or 0)
                    row["latency_s"] = float(row["latency_s"] or 0.0)
                    row["output"] = None if row["output"] is None else str(row["output"])  # replay: none, kept null
                    row["output"] = pack_output(row["output"], r.get("resps"))  # a log-likelihood item's resps too
                paid_now.append((cache, rows))
            log.extend(f"{label}\t{r['item_id']}\n" for r in fresh)
            by_key = {**paid, **{k: r for (_, k), r in zip(todo, fresh)}}
            out.append([by_key[k] for k in keys])
        # persist before returning (a dead driver loses nothing paid for): one part for the whole batch
        ScoreCache.add_many(paid_now)
        if self.call_log and log:  # after the cache write: an item logged is an item paid for and kept
            with open(self.call_log, "a") as handle:  # O_APPEND: one write, no interleaving
                handle.write("".join(log))
        return out

    def _cached_results(self, label: str, items: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
        cache = self.caches.get(label)
        if cache is None:
            return {}
        known = cache.load()
        out = {}
        for it, k in zip(items, keys):
            if k in known:
                output, resps = unpack_output(cache.outputs.get(k))
                out[k] = {"item_id": it["item_id"], "score": known[k], "output": output, "tokens": 0, "latency_s": 0.0,
                          "from_cache": True, **({"resps": json.loads(resps)} if resps is not None else {})}
        return out

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()


def set_torch_threads(threads: int) -> None:
    """torch's CPU threads (intra-op, and OpenMP's / MKL's for anything started later) set to ``threads``: a model
    actor's CPUs per call it scores at once (:meth:`certeval.hosting.pool_cpus.CpuPlan.threads`). Ray sets
    ``OMP_NUM_THREADS=1`` in an actor given no CPU count and the floor of its CPUs otherwise, unless the variable
    was already set (a driver's environment passes it on), and torch reads it once: set here, explicitly, before
    the host imports torch."""
    threads = max(1, int(threads))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    import torch

    torch.set_num_threads(threads)


def _torch_threads() -> int | None:
    """torch's intra-op CPU threads in this process, if a host imported torch (None: no torch here)."""
    import sys

    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def _exit_with_raylet(poll_s: float = 0.05) -> None:
    """End this actor's process as soon as its node's raylet dies (Linux: the raylet is the parent).

    Ray notices a dead raylet from the worker side only after a while; meanwhile the orphaned actor
    would go on scoring a batch the driver has already re-sent elsewhere (the item scored twice)."""
    import threading

    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as handle:
            if handle.read().strip() != "raylet":
                return
    except OSError:  # not Linux: rely on Ray's own check
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="certeval-raylet-watch", daemon=True).start()
