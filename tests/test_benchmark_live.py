"""benchmarks/live.py's building blocks on tiny sizes: the trivia task (JSONL + lm-eval YAML) and the noise-perturbed
model copy. No lm-eval run and no certeval run here (the benchmark's --quick run takes minutes)."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks._live_build import GEN_TASK, MC_TASK, perturbed_copy, trivia_items, write_gen_task, write_mc_task
from benchmarks.live import agreement, bar_seconds, parse_args


def _needs_trivia():
    from certeval.errors import InputError
    from certeval.inputs.trivia import lists_dir

    try:
        lists_dir()
    except InputError:
        pytest.skip("red-trivia is not installed")


def test_trivia_items_are_seeded_four_choice_questions():
    _needs_trivia()
    items = trivia_items(12, seed=3)
    assert len(items) == 12 and items == trivia_items(12, seed=3)
    assert [i["trivia_id"] for i in items] != [i["trivia_id"] for i in trivia_items(12, seed=4)]
    for item in items:
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        assert item["choices"][item["label"]] == item["answer"]


def test_task_yamls_point_at_their_jsonl(tmp_path):
    _needs_trivia()
    items = trivia_items(5, seed=0)
    mc = yaml.safe_load(write_mc_task(tmp_path, items).read_text())
    assert mc["task"] == MC_TASK and mc["dataset_path"] == "json" and mc["output_type"] == "multiple_choice"
    assert [m["metric"] for m in mc["metric_list"]] == ["acc"] and mc["doc_to_target"] == "label"
    docs = [json.loads(line) for line in open(mc["dataset_kwargs"]["data_files"]["test"])]
    assert docs == items
    gen = yaml.safe_load(write_gen_task(tmp_path, items).read_text())
    assert gen["task"] == GEN_TASK and gen["output_type"] == "generate_until"
    assert gen["doc_to_target"] == "{{answer}}" and gen["metric_list"][0]["metric"] == "exact_match"
    assert gen["num_fewshot"] == 3 and gen["fewshot_split"] == "test" and gen["filter_list"][0]["name"] == "strip"
    assert gen["generation_kwargs"]["until"][0] == "\n"


def test_perturbed_copy_changes_every_weight_by_a_seeded_small_amount(tmp_path):
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    source = tmp_path / "base"
    source.mkdir()
    weights = {"embed.weight": rng.standard_normal((8, 4)).astype(np.float32),
               "norm.weight": np.ones(4, dtype=np.float32),  # std 0: scaled by its root mean square instead
               "scalar": np.array([2.0], dtype=np.float32)}
    st.save_file(weights, str(source / "model.safetensors"), metadata={"format": "pt"})
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "tokenizer.json").write_text("{}")
    (source / "certeval-smollm2.ok").write_text("converted\n")
    one = perturbed_copy(source, tmp_path / "one", scale=0.05, seed=1)
    again = perturbed_copy(source, tmp_path / "again", scale=0.05, seed=1)
    other = perturbed_copy(source, tmp_path / "other", scale=0.05, seed=2)
    assert (one / "tokenizer.json").read_text() == "{}" and (one / "config.json").is_file()
    assert not (one / "certeval-smollm2.ok").exists()
    a, b, c = (st.load_file(str(p / "model.safetensors")) for p in (one, again, other))
    for name, w in weights.items():
        assert a[name].dtype == w.dtype and a[name].shape == w.shape
        if w.size == 1:
            assert np.array_equal(a[name], w)
            continue
        rms = float(np.sqrt(np.mean(w ** 2)))
        assert 0 < float(np.std(a[name] - w)) < 0.2 * rms, name  # changed, by a small amount
        assert np.array_equal(a[name], b[name]) and not np.array_equal(a[name], c[name]), name
    stamp = (one / "live-perturbed.json").stat().st_mtime_ns
    assert perturbed_copy(source, tmp_path / "one", scale=0.05, seed=1) == one  # reused, not rebuilt
    assert (one / "live-perturbed.json").stat().st_mtime_ns == stamp


def test_cli_defaults_and_helpers():
    quick = parse_args(["--quick"])
    assert quick.items == 120 and quick.runs == ["certify", "compare"] and quick.goals == [0.1]
    full = parse_args([])
    assert full.items == 1000 and full.runs == ["certify", "compare", "compare_distinct", "rank", "select", "generation"]
    assert full.goals == [0.1, 0.05] and full.distinct_noise == 0.15
    assert parse_args(["--quick", "--generation"]).runs == ["certify", "compare", "generation"]
    with pytest.raises(SystemExit):
        parse_args(["--runs", "certify,nope"])
    log = "Running loglikelihood requests:  50%|#####     | 240/480 [00:10<00:10]\r" \
          "Running loglikelihood requests: 100%|##########| 480/480 [01:05<00:00, 7.3it/s]\n"
    assert bar_seconds(log) == (480, 65)
    assert agreement({0: 1.0, 3: 0.0, 7: 1.0}, {0: 1.0, 3: 1.0}) == {"items": 2, "missing_in_lm_eval": 1, "equal": 1,
                                                                      "rate": 0.5}


def test_throughput_benchmark_arguments_and_items(tmp_path):
    """benchmarks/throughput.py (run by hand: minutes of lm-eval and SmolLM2): its defaults and the items it feeds
    both tools, as certeval's lm-eval task reader builds them."""
    from benchmarks.throughput import SETUPS, parse_args, task_items

    quick = parse_args(["--quick"])
    assert quick.items == 48 and quick.repeats == 1 and quick.setups == list(SETUPS) and quick.batch_size == 16
    assert parse_args(["--setups", "lm_eval,certeval_actor"]).setups == ["lm_eval", "certeval_actor"]
    with pytest.raises(SystemExit):
        parse_args(["--setups", "nope"])
    _needs_trivia()
    pytest.importorskip("lm_eval")
    items = task_items(tmp_path, 3, seed=0)
    assert len(items) == 3 and all(len(item["choices"]) == 4 for item in items)
    assert all(item["prompt"].startswith("Question: ") and item["prompt"].endswith("\nAnswer:") for item in items)
