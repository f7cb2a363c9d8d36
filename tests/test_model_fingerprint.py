"""The score cache's key names what was scored: a model folder by its files' content (certeval.inputs.model_fingerprint),
a server by its address. Files here are small real files; no model loads (tests/test_score_cache_key.py runs
the stale-weights case end to end)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from certeval.errors import InputError
from certeval.inputs.model_fingerprint import HashMemo, fingerprint_models, folder_files
from certeval.inputs.model_spec import parse_model_spec
from certeval.runs.plan import RunPlan, cache_identity


def _folder(root: Path, weights: bytes = b"\x01" * 4096) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "model.safetensors").write_bytes(weights)
    return root


def _fp(path: Path, memo: Path, budget_s: float = 60.0, text: str | None = None):
    return fingerprint_models([parse_model_spec(text or f"hf:{path}")], memo, budget_s)[0]


def test_weights_copied_over_a_folder_change_its_fingerprint_even_with_size_and_mtime_kept(tmp_path):
    folder = _folder(tmp_path / "latest")
    before = _fp(folder, tmp_path / "memo")
    assert before.covers == "files" and [n for n, _ in before.files] == ["config.json", "model.safetensors",
                                                                        "tokenizer.json"]
    assert _fp(folder, tmp_path / "memo") == before  # unchanged: the same key
    weights = folder / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"\x02" * 4096)  # other weights, same size, in place (same inode)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime back, as ``cp -p`` may leave it
    after = _fp(folder, tmp_path / "memo")
    assert after.digest != before.digest and after.changed(dict(before.files)) == ["model.safetensors"]
    # a tokenizer edit changes it too; a file added or removed as well
    (folder / "tokenizer.json").write_text('{"version": "1.1"}')
    assert _fp(folder, tmp_path / "memo").changed(dict(after.files)) == ["tokenizer.json"]


def test_the_fingerprint_is_of_content_not_of_path_or_times(tmp_path):
    a = _folder(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    os.utime(b / "model.safetensors", ns=(1, 1))
    fa, fb = _fp(a, tmp_path / "memo"), _fp(b, tmp_path / "memo")
    assert fa.digest == fb.digest  # a folder copied elsewhere keeps its scores
    assert cache_identity(f"hf:{a}", fa) == cache_identity(f"hf:{b}", fb)
    # the options that change answers stay in the key, the runtime ones do not
    assert cache_identity(f"hf:{a}?max_new_tokens=8", fa) != cache_identity(f"hf:{a}", fa)
    assert cache_identity(f"hf:{a}?batch=4", fa) == cache_identity(f"hf:{a}", fa)


def test_a_servers_key_is_its_address_and_model_name(tmp_path):
    spec = "openai:http://127.0.0.1:9/v1#gpt-x"
    fp = _fp(tmp_path, tmp_path / "memo", text=spec)
    assert fp.covers == "address" and not fp.files
    other = "openai:http://127.0.0.1:8/v1#gpt-x"
    assert cache_identity(spec, fp) != cache_identity(other, _fp(tmp_path, tmp_path / "memo", text=other))


def test_training_state_hidden_entries_and_link_loops_are_left_out_and_file_links_followed(tmp_path):
    folder = _folder(tmp_path / "ckpt")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth", "trainer_state.json", "training_args.bin"):
        (folder / name).write_bytes(b"state")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "lock").write_bytes(b"x")
    (folder / "sub").mkdir()
    (folder / "sub" / "loop").symlink_to(folder)  # a link back up: each folder is read once
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"linked weights")
    (folder / "extra.safetensors").symlink_to(blob)  # a snapshot's link into a blob store: followed
    names = [name for name, _, _ in folder_files(folder, "--model x")]
    assert names == ["config.json", "extra.safetensors", "model.safetensors", "tokenizer.json"]
    before = _fp(folder, tmp_path / "memo")
    blob.write_bytes(b"other weights!")  # what the link points at changed
    assert _fp(folder, tmp_path / "memo").changed(dict(before.files)) == ["extra.safetensors"]


def test_a_link_to_nothing_is_one_line_naming_it(tmp_path):
    folder = _folder(tmp_path / "m")
    (folder / "model-00002.safetensors").symlink_to(tmp_path / "gone")
    with pytest.raises(InputError, match=r"model-00002\.safetensors' is a link to nothing") as err:
        _fp(folder, tmp_path / "memo")
    assert "\n" not in str(err.value) and f"--model 'hf:{folder}'" in str(err.value)


def test_content_is_hashed_once_per_file_version_and_the_bound_falls_back_to_stat(tmp_path):
    folder = _folder(tmp_path / "m")
    memo = tmp_path / "memo"
    err = io.StringIO()
    with redirect_stderr(err):
        late = _fp(folder, memo, budget_s=0.0)  # nothing may be read: every file named by its stat
    assert all(d.startswith("stat:") for _, d in late.files)
    assert err.getvalue().startswith("certeval: model files not hashed within 0 s") and err.getvalue().count("\n") == 1
    hashed = _fp(folder, memo)
    assert all(d.startswith("sha256:") for _, d in hashed.files) and hashed.digest != late.digest
    with redirect_stderr(io.StringIO()):  # the memo answers for unchanged files, even with no time to read
        assert _fp(folder, memo, budget_s=0.0) == hashed
    # a memo entry is keyed by the file's stat: a write (a new ctime) is read again
    path = str(folder / "model.safetensors")
    st = os.stat(path)
    assert HashMemo(memo).get(path, st) is not None
    (folder / "model.safetensors").write_bytes(b"\x01" * 4096)  # same bytes, written again
    assert HashMemo(memo).get(path, os.stat(path)) is None
    assert _fp(folder, memo) == hashed  # same content: same key


def test_a_plan_carries_its_models_fingerprints_and_config_json_their_digests(tmp_path):
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    replay_file = tmp_path / "scores.jsonl"
    replay_file.write_text("".join(f'{{"model": "m", "item_id": "q{i}", "score": {i % 2}}}\n' for i in range(4)))
    plan, _ = make_plan(Certify(models=[f"replay:{replay_file}#m"], goal="halfwidth:0.2",
                                    output=str(tmp_path / "runs"), options={"cache_dir": str(tmp_path / "cache")}))
    assert isinstance(plan, RunPlan) and plan.fingerprints[0].covers == "files"
    assert plan.config()["fingerprints"] == [{"covers": "files", "digest": plan.fingerprints[0].digest}]
    key = plan.cache_keys()
    replay_file.write_text(replay_file.read_text().replace('"score": 1', '"score": 0'))  # the record corrected
    again, _ = make_plan(Certify(models=[f"replay:{replay_file}#m"], goal="halfwidth:0.2",
                                     output=str(tmp_path / "runs"), options={"cache_dir": str(tmp_path / "cache")}))
    assert again.cache_keys() != key


def test_an_unreadable_model_file_exits_2_in_one_line_before_anything_starts(tmp_path):
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "nowhere.safetensors")
    bank = tmp_path / "bank.jsonl"
    bank.write_text('{"item_id": "q1", "question": "2+2?", "choices": ["4", "5"], "answer": 0}\n')
    proc = subprocess.run([sys.executable, "-m", "certeval", "certify", "--model", f"hf:{folder}", "--bank",
                           str(bank), "--goal", "halfwidth:0.2", "--output", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "model.safetensors' is a link to nothing" in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".prefect").exists()


def test_a_run_resumed_on_other_files_is_refused_in_one_line(tmp_path):
    from certeval.requests import Certify
    from certeval.runs.plan import claim_run, make_plan

    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(f'{{"model": "m", "item_id": "q{i}", "score": {i % 2}}}\n' for i in range(4)))
    request = Certify(models=[f"replay:{scores}#m"], goal="halfwidth:0.2", output=str(tmp_path / "runs"),
                          run_id="r", options={"cache_dir": str(tmp_path / "cache")})
    plan, _ = make_plan(request)
    assert claim_run(plan) is False
    assert claim_run(make_plan(request)[0]) is True  # the same files: a resume
    scores.write_text(scores.read_text().replace('"score": 1', '"score": 0'))
    config = (tmp_path / "runs" / "r" / "config.json").read_bytes()
    with pytest.raises(InputError, match=r"run id 'r' .* scored model 'm' from other files .* use another --run-id"):
        claim_run(make_plan(request)[0])
    assert (tmp_path / "runs" / "r" / "config.json").read_bytes() == config
