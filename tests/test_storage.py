"""Run-folder storage: atomic writes, config claims on resume, the score cache, fsspec URLs."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from certeval.errors import InputError
from certeval.storage import RunStore, ScoreCache, cache_key, filesystem, item_key, safe_name


def test_json_and_parquet_round_trip_without_temporaries(tmp_path):
    store = RunStore(str(tmp_path), "r1")
    store.write_results({"models": [{"mean": float("nan"), "n": 3}]})
    assert json.loads((tmp_path / "r1" / "results.json").read_text()) == {"models": [{"mean": None, "n": 3}]}
    frame = pd.DataFrame({"model": ["a"], "item_id": ["x"], "score": [1.0], "round": [0], "prob": [0.5]})
    store.write_round(0, frame)
    pd.testing.assert_frame_equal(store.read_rounds(), frame)
    assert not [p for p in (tmp_path / "r1").rglob("*") if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    store = RunStore(str(tmp_path), "r1")
    store.write_results({"v": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        store.write_results({"v": 2})
    monkeypatch.undo()
    assert store.read_results() == {"v": 1}  # never half-written under the final name
    assert not [p for p in (tmp_path / "r1").rglob("*") if p.name.endswith(".tmp")]  # and no temporary left


def test_a_full_disk_mid_write_leaves_no_temporary(tmp_path, monkeypatch):
    store = RunStore(str(tmp_path), "r1")
    store.write_results({"v": 1})

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        store.write_results({"v": 2})
    monkeypatch.undo()
    assert store.read_results() == {"v": 1}
    assert not [p for p in (tmp_path / "r1").rglob("*") if p.name.endswith(".tmp")]


def test_claim_accepts_the_same_config_and_refuses_a_changed_one(tmp_path):
    store = RunStore(str(tmp_path), "r1")
    assert store.claim({"goal": "halfwidth:0.1", "seed": 0, "created": "t1"}, ("goal", "seed")) is False
    assert store.claim({"goal": "halfwidth:0.1", "seed": 0, "created": "t2"}, ("goal", "seed")) is True
    before = (tmp_path / "r1" / "config.json").read_bytes()
    with pytest.raises(InputError, match="seed"):
        store.claim({"goal": "halfwidth:0.1", "seed": 1}, ("goal", "seed"))
    assert (tmp_path / "r1" / "config.json").read_bytes() == before


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "x" * 200])
def test_run_id_must_be_a_plain_name(tmp_path, bad):
    with pytest.raises(InputError, match="run-id"):
        RunStore(str(tmp_path), bad)


def test_score_cache_parts_and_keys(tmp_path):
    fs, path = filesystem(str(tmp_path / "cache"))
    cache = ScoreCache(fs, path)
    assert cache.load() == {}
    cache.add([{"item_key": "a", "item_id": "a", "score": 1.0, "tokens": 3, "latency_s": 0.1}])
    cache.add([{"item_key": "b", "item_id": "b", "score": 0.0, "tokens": 2, "latency_s": 0.1}])
    assert cache.load() == {"a": 1.0, "b": 0.0}
    # same id, other text: another cache entry; no text: the id itself
    assert item_key({"item_id": "q1", "question": "2+2?"}) != item_key({"item_id": "q1", "question": "2+3?"})
    assert item_key({"item_id": "q1"}) == "q1"
    assert cache_key("hf:m", "normalized", {"t": 0}) != cache_key("hf:m", "exact", {"t": 0})


def test_memory_filesystem_url_works_like_a_folder():
    store = RunStore("memory://certeval-test-root", "r1")
    store.write_state("model/with:odd chars", {"round": 2})
    assert store.read_state("model/with:odd chars") == {"round": 2}
    assert "/" not in safe_name("model/with:odd chars")


def test_score_cache_keeps_outputs_and_reads_parts_written_before_them(tmp_path):
    import pandas as pd

    from certeval.storage import prompt_hash

    fs, path = filesystem(str(tmp_path / "_cache" / "k1"))
    cache = ScoreCache(fs, path)
    item = {"item_id": "q1", "question": "Capital of France?", "answers": ["Paris"]}
    key = item_key(item)
    assert prompt_hash({"item_id": "r"}) is None and prompt_hash({"item_id": "r", "question": float("nan")}) is None
    assert prompt_hash(item) == prompt_hash({**item, "answers": ["Paris", "paris"], "item_id": "other"})  # asked text
    assert prompt_hash(item) != prompt_hash({**item, "question": "Capital of Spain?"})
    cache.add([{"item_key": key, "item_id": "q1", "score": 1.0, "tokens": 9, "latency_s": 0.1, "output": "Paris",
                "prompt_hash": prompt_hash(item)},
               {"item_key": "r", "item_id": "r", "score": 0.0, "tokens": 0, "latency_s": 0.0}])  # replay: no output
    part = pd.read_parquet(next((tmp_path / "_cache" / "_shared" / "parts").glob("*.parquet")))
    nulls = lambda column: [None if pd.isna(v) else v for v in part[column]]  # noqa: E731
    assert nulls("output") == ["Paris", None] and nulls("prompt_hash") == [prompt_hash(item), None]
    # a part in the layout of runs stored before outputs were kept (no output / prompt_hash columns)
    pd.DataFrame({"item_key": ["old"], "item_id": ["old"], "score": [0.5], "tokens": [1], "latency_s": [0.0],
                  "cache": ["k1"]}).to_parquet(tmp_path / "_cache" / "_shared" / "parts" / "0old.parquet")
    assert cache.load() == {key: 1.0, "r": 0.0, "old": 0.5}
    assert cache.outputs == {key: "Paris", "r": None, "old": None}
