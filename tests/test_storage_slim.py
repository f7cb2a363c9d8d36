"""Slim run folders: per-item constant arrays stored once by content hash, compact states, a bounded score
cache (parts merged), and the damaged cases of each (one-line InputError)."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from certeval.errors import InputError
from certeval.estimators import BankSpec, make_method, method_from_state
from certeval.storage import (
    MAX_PARTS,
    REF_KEY,
    Folder,
    RunStore,
    ScoreCache,
    compact_parts,
    dumps,
    filesystem,
    safe_name,
)


def _started(name: str, n: int = 300, dim: int = 16, rounds: int = 3, seed: int = 0, **params):
    rng = np.random.default_rng(seed)
    spec = BankSpec(n_items=n, subsets=np.arange(n) % 7, subset_names=tuple(f"s{i}" for i in range(7)),
                    features=rng.standard_normal((n, dim)))
    method = make_method(name, **params).start(spec)
    for r in range(rounds):
        prop = method.propose(40, np.random.default_rng([seed, r]))
        method.update(prop.items, (rng.random(len(prop.items)) < 0.6).astype(float))
    return method


def _wrapped(method, round_: int = 2) -> dict:
    return {"round": round_, "method_state": method.state(), "decision": None}


@pytest.mark.parametrize("name", ["uniform", "static", "seq", "cer-eval", "adaptive"])
def test_features_are_stored_once_by_hash_and_read_back_exactly(tmp_path, name):
    method = _started(name)
    store = RunStore(str(tmp_path), "r")
    for r in range(3):  # three rounds: one features file, never rewritten
        store.write_state("m", _wrapped(method, r))
    raw = json.loads((tmp_path / "r" / "state" / "m.json").read_text())
    feats = raw["method_state"]["bank"]["features"]
    assert set(feats) == {REF_KEY, "shape", "dtype"} and feats["shape"] == [300, 16]
    files = sorted((tmp_path / "r" / "features").glob("*.npy"))
    assert f"{feats[REF_KEY]}.npy" in [p.name for p in files]
    arr = np.load(files[[p.name for p in files].index(f"{feats[REF_KEY]}.npy")])
    assert np.array_equal(arr, method.bank_.features)
    back = store.read_state("m")
    inline = json.loads(dumps(_wrapped(method)))  # what the writer stored before: the same content
    assert back["method_state"] == inline["method_state"]
    assert RunStore(str(tmp_path), "r").read_state("m") == back  # a fresh process reads the files, not a memo
    again = method_from_state(back["method_state"])
    assert again.result() == method.result()


def test_state_is_small_and_compact(tmp_path):
    method = _started("cer-eval", n=567, dim=384)
    store = RunStore(str(tmp_path), "r")
    store.write_state("m", _wrapped(method))
    size = (tmp_path / "r" / "state" / "m.json").stat().st_size
    assert size < 10_000 < len(dumps(_wrapped(method)))  # 567 × 384 floats inline were megabytes
    assert b"\n" not in (tmp_path / "r" / "state" / "m.json").read_bytes()


def test_an_old_state_with_inline_features_still_loads(tmp_path):
    method = _started("cer-eval")
    store = RunStore(str(tmp_path), "r")
    store.folder.write_json("state/m.json", _wrapped(method))  # the format written before features/
    back = store.read_state("m")
    assert isinstance(back["method_state"]["bank"]["features"], list)
    assert method_from_state(back["method_state"]).result() == method.result()
    assert not (tmp_path / "r" / "features").exists()


def test_an_old_state_with_hex_rejected_grids_still_loads(tmp_path):
    from certeval.estimators.single.betting_strata import _unpack

    method = _started("uniform", combine="union")  # per-sub-dataset grids: what states of that time held
    state = _wrapped(method)
    extra = state["method_state"]["extra"]
    extra["rejected"] = {k: np.packbits(_unpack(v, 4097).astype(np.uint8)).tobytes().hex()
                         for k, v in extra["rejected"].items()}
    store = RunStore(str(tmp_path), "r")
    store.folder.write_json("state/m.json", state)
    assert method_from_state(store.read_state("m")["method_state"]).result() == method.result()


@pytest.mark.parametrize("damage", ["missing", "edited", "truncated", "malformed-ref"])
def test_a_missing_or_damaged_features_file_is_one_line(tmp_path, damage):
    store = RunStore(str(tmp_path), "r")
    store.write_state("m", _wrapped(_started("cer-eval")))
    ref = json.loads((tmp_path / "r" / "state" / "m.json").read_text())["method_state"]["bank"]["features"]
    path = tmp_path / "r" / "features" / f"{ref[REF_KEY]}.npy"
    if damage == "missing":
        path.unlink()
    elif damage == "edited":
        arr = np.load(path)
        arr[0, 0] += 1.0
        np.save(path, arr)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        state_path = tmp_path / "r" / "state" / "m.json"
        raw = json.loads(state_path.read_text())
        raw["method_state"]["bank"]["features"][REF_KEY] = "../x"
        state_path.write_text(json.dumps(raw))
    with pytest.raises(InputError) as info:
        RunStore(str(tmp_path), "r").read_state("m")
    text = str(info.value)
    assert "damaged" in text and "start a new --run-id" in text and "\n" not in text


def test_a_damaged_packed_float_log_is_one_line(tmp_path):
    store = RunStore(str(tmp_path), "r")
    method = _started("uniform", rounds=6)
    method.scores_[method.order_] = np.linspace(0.01, 0.99, method.order_.size)  # not 0/1: packed
    store.write_state("m", _wrapped(method))
    path = tmp_path / "r" / "state" / "m.json"
    raw = json.loads(path.read_text())
    assert set(raw["method_state"]["scores"]) == {"f64", "shape"}
    assert store.read_state("m")["method_state"]["scores"] == method.state()["scores"]
    raw["method_state"]["scores"]["f64"] = "not base64!"
    path.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=r"damaged.*start a new --run-id"):
        store.read_state("m")


# -- the score cache: parts merged, never lost --------------------------------------------------------------


def _cache(tmp_path, key="k"):
    fs, path = filesystem(str(tmp_path / "_cache" / key))
    return ScoreCache(fs, path)


def _add_parts(cache, n_parts, per_part=3, start=0):
    for p in range(n_parts):
        cache.add([{"item_key": f"i{start + p * per_part + j}", "item_id": f"i{start + p * per_part + j}",
                    "score": float((p + j) % 2), "tokens": 1, "latency_s": 0.0} for j in range(per_part)])


def _parts(cache):
    return [n for n in cache.shared.list("parts") if n.endswith(".parquet")]


def test_compaction_merges_parts_and_keeps_every_score(tmp_path):
    cache, other = _cache(tmp_path, "a"), _cache(tmp_path, "b")
    _add_parts(cache, 40)
    _add_parts(other, 5, start=1000)
    before = ScoreCache.load_many([cache, other])
    assert len(_parts(cache)) == 45
    assert ScoreCache.compact_many([cache, other]) == 45
    assert len(_parts(cache)) == 1
    assert ScoreCache.load_many([cache, other]) == before
    assert ScoreCache.compact_many([cache]) == 0  # at most MAX_PARTS: nothing to do


def test_compaction_at_load_uses_the_parts_just_read(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    _add_parts(cache, MAX_PARTS + 4)
    want = cache.load()
    reads = []
    real = Folder.read_bytes
    monkeypatch.setattr(Folder, "read_bytes", lambda self, rel: (reads.append(rel) if rel.startswith("parts/") else None)
                        or real(self, rel))
    assert ScoreCache.load_many([cache], compact=True) == [want]
    assert len(reads) == MAX_PARTS + 4  # each part read once: the merge wrote from memory
    assert len(_parts(cache)) == 1 and cache.load() == want
    _add_parts(cache, 3, start=500)  # below the bound: left as parts
    ScoreCache.load_many([cache], compact=True)
    assert len(_parts(cache)) == 4


def test_a_crash_between_the_merged_write_and_the_deletes_is_harmless(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    _add_parts(cache, 20)
    want = cache.load()
    import certeval.storage.cache as storage_cache  # the score cache's own module makes the calls

    def crash(fs, method, *args, **kwargs):
        if method == "rm_file":
            raise KeyboardInterrupt  # killed right after the merged part was written
        return getattr(fs, method)(*args, **kwargs)

    monkeypatch.setattr(storage_cache, "bounded", crash)
    with pytest.raises(KeyboardInterrupt):
        compact_parts(cache.shared, ["cache", "item_key"])
    monkeypatch.undo()
    assert len(_parts(cache)) == 21 and cache.load() == want  # every row twice: the first per key wins
    assert compact_parts(cache.shared, ["cache", "item_key"]) == 21
    assert len(_parts(cache)) == 1 and cache.load() == want


def test_a_part_written_after_the_listing_is_never_deleted(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    _add_parts(cache, 20)
    real_list = Folder.list

    def list_then_write(self, rel):
        names = real_list(self, rel)
        if rel == "parts":  # a concurrent writer lands a part just after this listing
            monkeypatch.setattr(Folder, "list", real_list)
            _add_parts(cache, 1, start=900)
        return names

    monkeypatch.setattr(Folder, "list", list_then_write)
    assert compact_parts(cache.shared, ["cache", "item_key"]) == 20
    assert len(_parts(cache)) == 2
    assert {"i900", "i901", "i902"} <= set(cache.load())


def test_a_damaged_part_is_left_alone(tmp_path):
    cache = _cache(tmp_path)
    _add_parts(cache, 20)
    want = cache.load()
    bad = tmp_path / "_cache" / "_shared" / "parts" / "0bad.parquet"
    bad.write_bytes(b"not parquet")
    assert compact_parts(cache.shared, ["cache", "item_key"]) == 20
    assert bad.exists() and len(_parts(cache)) == 2
    assert cache.load() == want and cache.skipped


def test_old_per_cache_parts_are_compacted_too(tmp_path):
    cache = _cache(tmp_path)
    for p in range(MAX_PARTS + 2):  # parts a cache folder held itself (before the shared parts)
        cache.folder.write_parquet(f"parts/{p:032x}.parquet", pd.DataFrame(
            {"item_key": [f"o{p}"], "item_id": [f"o{p}"], "score": [1.0], "tokens": [1], "latency_s": [0.0]}))
    want = cache.load()
    ScoreCache.load_many([cache], compact=True)
    assert len(cache.folder.list("parts")) == 1 and cache.load() == want


# -- through the round loop (Run: select, infer, update, decide, store), in-process --------------------------


def _bank(tmp_path, n=150, dim=32):
    from certeval.inputs.banks import load_scores

    frame = load_scores("bundled:helm_mmlu")
    items = frame[frame["model"] == "openai_davinci"][["item_id", "subset"]].drop_duplicates("item_id")[:n]
    items = items.reset_index(drop=True)
    items["embedding"] = list(np.random.default_rng(0).standard_normal((len(items), dim)))
    path = tmp_path / "bank.parquet"
    items.to_parquet(path, index=False)
    return str(path)


def _plan(tmp_path, bank, run_id, **kw):
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    kw = {"goal": "halfwidth:0.0001", "method": "cer-eval", "batch_size": 5, "seed": 4, **kw}
    plan, _ = make_plan(Certify(models=["replay:bundled:helm_mmlu#openai_davinci"], bank=bank,
                                    output=str(tmp_path / "runs"), run_id=run_id, **kw))
    return plan


def test_a_run_of_many_rounds_leaves_few_cache_parts_and_a_rerun_scores_nothing(tmp_path):
    from benchmarks.state_size import drive

    bank = _bank(tmp_path)
    plan = _plan(tmp_path, bank, "first", max_items=120)
    first = drive(plan)
    label = plan.labels[0]
    assert first.round == 24 and first.sent[label] == 120
    shared = tmp_path / "runs" / "_cache" / "_shared" / "parts"
    assert 1 <= len(list(shared.glob("*.parquet"))) <= MAX_PARTS  # 24 batches written, merged at the end
    cache = first.caches[label]
    assert len(cache.load()) == 120
    # the same request under another run id proposes the same items: every one answered by the cache
    again = drive(_plan(tmp_path, bank, "second", max_items=120))
    assert again.sent[label] == 0 and again.n_scored(label) == 120
    assert again.methods[label].result() == first.methods[label].result()
    # the first run's folder: one features file, states by reference, resumable
    folder = tmp_path / "runs" / "first"
    assert len(list((folder / "features").glob("*.npy"))) == 1
    state = json.loads((folder / "state" / f"{safe_name(label)}.json").read_text())
    assert REF_KEY in state["method_state"]["bank"]["features"]


def test_a_resumed_run_continues_from_states_by_reference_and_refuses_a_lost_features_file(tmp_path):
    from benchmarks.state_size import drive
    from certeval.runs.run import Run

    bank = _bank(tmp_path)
    plan = _plan(tmp_path, bank, "r", goal="halfwidth:0.2", batch_size=10)
    done = drive(plan)
    label = plan.labels[0]
    assert done.done and 0 < done.n_scored(label) < 150
    run = Run.open(plan)  # the finished run reopens from its stored state
    try:
        run.embed()
        run.restore()
        assert run.done and run.methods[label].result() == done.methods[label].result()
    finally:
        run.store.release_lock()
    for path in (tmp_path / "runs" / "r" / "features").glob("*.npy"):
        os.remove(path)
    run = Run.open(plan)
    try:
        with pytest.raises(InputError, match=r"features/[0-9a-f]{64}\.npy.*is missing.*start a new --run-id"):
            run.embed()
            run.restore()
    finally:
        run.store.release_lock()


# -- on an object store (moto's S3 server on 127.0.0.1) ------------------------------------------------------


@pytest.fixture
def s3_root(monkeypatch):
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("slim-test")
    yield fs
    server.stop()


def test_states_by_reference_and_cache_compaction_on_s3(s3_root):
    fs = s3_root
    method = _started("cer-eval")
    store = RunStore("s3://slim-test/runs", "r")
    for r in range(3):
        store.write_state("m", _wrapped(method, r))
    assert len(fs.ls("slim-test/runs/r/features", refresh=True)) == 2  # features and subset codes, once each
    back = RunStore("s3://slim-test/runs", "r").read_state("m")
    assert method_from_state(back["method_state"]).result() == method.result()
    cache = ScoreCache(*filesystem("s3://slim-test/runs/_cache/k"))
    _add_parts(cache, MAX_PARTS + 5)
    want = cache.load()
    assert ScoreCache.load_many([cache], compact=True) == [want]
    assert len(fs.ls("slim-test/runs/_cache/_shared/parts", refresh=True)) == 1
    assert cache.load() == want
    fs.rm_file(next(p for p in fs.ls("slim-test/runs/r/features", refresh=True)))
    with pytest.raises(InputError, match=r"damaged.*is missing.*start a new --run-id"):
        RunStore("s3://slim-test/runs", "r").read_state("m")
