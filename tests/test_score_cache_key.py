"""A checkpoint folder certified, other weights copied over it (what a training run's ``latest/`` does), certified
again: the second run scores the new weights and says why it did not reuse the cache; an unchanged folder
reuses it. The same for the scheduled checkpoint certification, which reuses a checkpoint's earlier run only on
the files that run was made on. Real parts: tiny Llama checkpoints with SmolLM2's tokenizer (random weights, two seeds, no download),
the session's Ray and Prefect, the flow as the CLI runs it."""

from __future__ import annotations

import io
import json
import os
import shutil
from contextlib import redirect_stderr

import numpy as np
import pytest

from test_pipeline_support import needs_small_lm

pytestmark = pytest.mark.slow


def _checkpoint(path, tokenizer, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _bank_and_checkpoints(tmp_path):
    """Two tiny checkpoints (seeds 100 and 7) and a bank whose answer key is the first one's own picks: it scores
    1.0; the other's mean (below 1.0) is returned with them."""
    from transformers import AutoTokenizer

    from certeval.hosting.base import make_host
    from certeval.inputs.smollm import ensure_converted

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_converted()))
    first, other = _checkpoint(tmp_path / "step-100", tokenizer, 100), _checkpoint(tmp_path / "step-200", tokenizer, 7)
    words = ["red", "blue", "green", "seven", "Paris", "water", "stone", "river", "apple", "north", "music", "glass"]
    items = [{"item_id": f"q{i}", "question": f"Question {i}: which word comes after {words[i % 12]}?",
              "choices": [words[(i + k) % 12] for k in (1, 3, 5, 7)], "answer": 0} for i in range(24)]
    picks = {p: [r["output"] for r in make_host(f"hf:{p}?scorer=mc-loglik").score(items)] for p in (first, other)}
    for item, pick in zip(items, picks[first]):  # the first checkpoint answers every item right
        item["answer"] = item["choices"].index(pick)
    other_mean = float(np.mean([p == it["choices"][it["answer"]] for p, it in zip(picks[other], items)]))
    assert other_mean < 1.0  # the other weights answer differently: a stale cache would show 1.0
    bank = tmp_path / "bank.jsonl"
    bank.write_text("".join(json.dumps(item) + "\n" for item in items))
    return bank, first, other, other_mean


def _copy_weights(source, folder) -> None:
    """``source``'s weights written over ``folder``'s in place, as a trainer's save does, the old mtime put back."""
    weights = folder / "model.safetensors"
    st = weights.stat()
    assert (source / "model.safetensors").stat().st_size == st.st_size  # same shapes: same size
    shutil.copyfile(source / "model.safetensors", weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_weights_copied_over_a_certified_folder_are_scored_anew_and_the_run_says_why(tmp_path, infra, kept_actors):
    needs_small_lm()
    from certeval.flows.pipeline import run_plan
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    bank, first, other, other_mean = _bank_and_checkpoints(tmp_path)
    latest = tmp_path / "latest"
    shutil.copytree(first, latest)

    def certify(run_id: str, folder=latest) -> tuple[dict, str]:
        plan, prepared = make_plan(Certify(models=[f"hf:{folder}?scorer=mc-loglik"], bank=str(bank), goal="halfwidth:0.01",
            batch_size=24, output=str(tmp_path / "runs"), run_id=run_id, ray_address=infra,
            options={"keep_actors": True, "cache_dir": str(tmp_path / "cache")}))
        err = io.StringIO()
        with redirect_stderr(err):
            results = run_plan(plan, prepared=prepared)
        stored = json.loads((tmp_path / "runs" / run_id / "results.json").read_text())
        assert stored["models"][0]["score_cache"] == results["models"][0]["score_cache"]
        return results["models"][0], err.getvalue()

    one, err = certify("one")
    assert (one["items_sent_to_model"], one["mean"]) == (24, pytest.approx(1.0)) and "files changed" not in err
    assert one["score_cache"]["covers"] == "files" and one["score_cache"]["not_reused"] is None
    two, err = certify("two")  # unchanged folder: every score from the cache
    assert (two["items_sent_to_model"], two["mean"], two["score_cache"]) == (0, one["mean"], one["score_cache"])

    _copy_weights(other, latest)
    kept_actors()  # the kept actor of the earlier weights holds the CPUs (it is never adopted: its name differs)
    three, err = certify("three")
    assert three["items_sent_to_model"] == 24 and three["mean"] == pytest.approx(other_mean)
    why = ("model latest: its files changed since its scores were last cached (model.safetensors); scores cached "
           "for the earlier files are not reused")
    assert f"certeval: {why}" in err.splitlines() and three["score_cache"]["not_reused"] == why
    assert three["score_cache"]["key"] != one["score_cache"]["key"]
    # the same weights in another folder are the same model: its scores are reused
    kept_actors()
    four, _ = certify("four", folder=other)
    assert (four["items_sent_to_model"], four["mean"]) == (0, pytest.approx(other_mean))
    assert four["score_cache"]["key"] == three["score_cache"]["key"]


def test_scheduled_certification_certifies_a_checkpoint_anew_when_its_files_changed(tmp_path, infra, kept_actors):
    """``certify_checkpoints_flow`` over a folder holding ``latest/``: a tick on unchanged files reuses its run; after
    other weights are copied over it the next tick certifies them (a run named by their fingerprint, one line on
    stderr saying why), where the old rule (skip a checkpoint whose ``ckpt-<name>`` run has results) would have
    reported the earlier weights' 1.0; the weights copied back reuse the first run, scoring nothing."""
    needs_small_lm()
    from certeval.flows.checkpoints import certify_checkpoints_flow
    from certeval.inputs.model_fingerprint import fingerprint_models
    from certeval.inputs.model_spec import parse_model_spec
    from certeval.requests import Certify
    from certeval.storage import RunStore

    bank, first, other, other_mean = _bank_and_checkpoints(tmp_path)
    kept_actors()  # the actors the module's earlier test kept hold the shared Ray's CPUs
    folder, runs = tmp_path / "checkpoints", tmp_path / "runs"
    shutil.copytree(first, folder / "latest")

    def tick() -> tuple[dict, str]:
        err = io.StringIO()
        with redirect_stderr(err):
            report = certify_checkpoints_flow(str(folder), Certify(
                output=str(runs), goal="halfwidth:0.01", bank=str(bank), batch_size=24, seed=1, ray_address=infra,
                options={"cache_dir": str(tmp_path / "cache")}))
        [row] = report["checkpoints"]
        return row, "\n".join(line for line in err.getvalue().splitlines() if line.startswith("certeval: checkpoint"))

    def stored(run_id: str) -> dict:
        return json.loads((runs / run_id / "results.json").read_text())

    one, said = tick()
    assert (one["run_id"], one["checkpoint"], one["mean"], said) == ("ckpt-latest", "latest", pytest.approx(1.0), "")
    assert stored("ckpt-latest")["models"][0]["items_sent_to_model"] == 24
    results_file = (runs / "ckpt-latest" / "results.json").read_bytes()
    again, said = tick()  # unchanged files: the same run, nothing scored, nothing said
    assert (again, said) == (one, "") and (runs / "ckpt-latest" / "results.json").read_bytes() == results_file

    before = json.loads((runs / "ckpt-latest" / "config.json").read_text())["fingerprints"][0]["digest"]
    _copy_weights(other, folder / "latest")
    [now] = fingerprint_models([parse_model_spec(f"hf:{folder / 'latest'}")], None)
    assert now.digest != before
    # the control: the old rule's test still holds (results under ckpt-latest), so it would have skipped the
    # checkpoint and reported the earlier weights' answer
    old_answer = RunStore(str(runs), "ckpt-latest").read_results()
    assert old_answer is not None and old_answer["models"][0]["mean"] == pytest.approx(1.0)
    three, said = tick()
    new_run = f"ckpt-latest-{now.digest[:12]}"
    assert said == (f"certeval: checkpoint latest: its files changed since run 'ckpt-latest' certified it (fingerprint "
                    f"{before} then, {now.digest} now); certifying it anew as run {new_run!r}")
    assert (three["run_id"], three["mean"]) == (new_run, pytest.approx(other_mean))
    assert stored(new_run)["models"][0]["items_sent_to_model"] == 24  # the new weights were asked every item
    assert stored(new_run)["models"][0]["score_cache"]["fingerprint"] == now.digest
    four, said = tick()  # the new files unchanged: their run reused
    assert (four, said) == (three, "")

    _copy_weights(first, folder / "latest")  # the first weights back: the first run answers again, nothing scored
    five, said = tick()
    assert (five, said) == (one, "")
    assert sorted(p.name for p in runs.glob("ckpt-*")) == ["ckpt-latest", new_run]
    assert json.loads((runs / "checkpoints.json").read_text())["checkpoints"][0]["run_id"] == "ckpt-latest"
