"""``certeval select --checkpoints``: three real transformers checkpoints in local folders, picked by a glob, on a
Ray of 2 CPUs. Each checkpoint is a model; three actors would need 3 CPUs, so the models share actors (said on
stderr, recorded in results.json) and the run finishes instead of waiting for a CPU.

The checkpoints are tiny Llama models with random weights (SmolLM2's tokenizer, no download). The bank's answer
key is what the middle checkpoint prefers (its own log-likelihood picks), so the exact best model is known: it
answers every item right, the others near chance."""

from __future__ import annotations

import json
import subprocess

import pytest

from test_pipeline_support import PYTHON, cli_env, needs_small_lm

pytestmark = pytest.mark.slow


def _checkpoints(root, tokenizer_dir) -> list:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    paths = []
    for step in (20, 100, 300):  # natural order: ckpt-20 before ckpt-100
        torch.manual_seed(step)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                             tie_word_embeddings=True)
        model = LlamaForCausalLM(config)
        path = root / f"ckpt-{step}"
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


def test_select_checkpoints_on_two_cpus_picks_the_known_best(tmp_path, state_dir, infra):
    needs_small_lm()
    from certeval.hosting.base import make_host
    from certeval.inputs.smollm import ensure_converted
    paths = _checkpoints(tmp_path / "train", ensure_converted())
    words = ["red", "blue", "green", "seven", "Paris", "water", "stone", "river", "apple", "north", "music", "glass"]
    items = [{"item_id": f"q{i}", "question": f"Question {i}: which word comes next after {words[i % 12]}?",
              "choices": [words[(i + k) % 12] for k in (1, 3, 5, 7)], "answer": 0} for i in range(48)]
    best = make_host(f"hf:{paths[1]}?scorer=mc-loglik")  # ckpt-100's own picks become the answer key
    picks = [r["output"] for r in best.score(items)]
    for item, pick in zip(items, picks):
        item["answer"] = item["choices"].index(pick)
    bank = tmp_path / "bank.jsonl"
    bank.write_text("".join(json.dumps(item) + "\n" for item in items))

    # on the session's shared Ray, 2 CPUs (init_ray's default; test_pipeline_support.ray_address): a Ray start per
    # command is not what this test is about (test_surfaces_faults starts the same select on a Ray of its own)
    def select(pattern: str, run_id: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        argv = [PYTHON, "-m", "certeval", "select", "--checkpoints", str(tmp_path / "train" / pattern), "--bank",
                str(bank), "--ray-address", infra, "--batch-size", "8", "--output", str(tmp_path / "runs"), "--run-id",
                run_id, "--json", *extra]
        proc = subprocess.run(argv, env=cli_env(state_dir), capture_output=True, text=True, timeout=900)
        assert proc.returncode in (0, 1), proc.stderr[-3000:]
        return proc, json.loads(proc.stdout)

    # yesterday's scheduled run saw two checkpoints; today's sees three and learns from yesterday's scores
    _, first = select("ckpt-[12]0*", "yesterday")
    assert [m["model"] for m in first["models"]] == ["ckpt-20", "ckpt-100"] and not first["history"]
    proc, res = select("ckpt-*", "ckpts", "--history", "auto")
    runs = tmp_path / "runs"
    assert res["history"]["sources"] == [str(runs / "yesterday")], res["history"]
    assert (f"certeval: --history auto: 1 earlier select run(s) under {runs} as history: {runs / 'yesterday'}"
            in proc.stderr.splitlines())
    config = json.loads((tmp_path / "runs" / "ckpts" / "config.json").read_text())
    assert config["history"] == [str(runs / "yesterday")]
    learned = {m["model"]: sorted(m["history"]["models"]) for m in res["models"]}
    # each checkpoint learns from yesterday's other checkpoints, never from its own earlier scores
    assert learned == {"ckpt-20": ["ckpt-100"], "ckpt-100": ["ckpt-20"], "ckpt-300": ["ckpt-100", "ckpt-20"]}
    assert [m["model"] for m in res["models"]] == ["ckpt-20", "ckpt-100", "ckpt-300"]  # named by their folders
    assert json.loads((tmp_path / "runs" / "ckpts" / "config.json").read_text())["models"] == [
        f"hf:{p}" for p in paths]
    assert res["selection"]["selected"] == ["ckpt-100"]
    scored = {m["model"]: m for m in res["selection"]["models"]}
    assert scored["ckpt-100"]["status"] == "selected"
    assert all(scored[m]["upper"] < scored["ckpt-100"]["mean"] for m in ("ckpt-20", "ckpt-300"))
    import pandas as pd  # every item the best checkpoint was asked, it answered right (the key is its own picks)

    rows = pd.concat(pd.read_parquet(p) for p in sorted((tmp_path / "runs" / "ckpts" / "rounds").glob("*.parquet")))
    assert (rows[rows["model"] == "ckpt-100"]["score"] == 1.0).all()
    # without --history nothing learns from the earlier runs now under --output: the same command, the same answer
    _, again = select("ckpt-[12]0*", "again")
    assert not again["history"]
    assert [(m["model"], m["mean"], m["lower"], m["upper"]) for m in again["models"]] == [
        (m["model"], m["mean"], m["lower"], m["upper"]) for m in first["models"]]
    # 3 actors of 1 CPU on a 2-CPU Ray: two actors, the first and third checkpoints in one
    assert res["pipeline"]["shared_actors"] == {"shared-0": ["ckpt-20", "ckpt-300"]}
    assert "share 2 actor(s)" in proc.stderr and "the Ray cluster has 2" in proc.stderr
