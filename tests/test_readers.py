"""lm-eval samples files (the format lm-eval's --log_samples documents) as scores and as history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.inputs.banks import load_bank, load_scores
from certeval.inputs.history import load_history


def write_samples(folder, model: str, task: str, scores, metric: str = "acc") -> str:
    """A samples file as lm-eval writes it: <output_path>/<model>/samples_<task>_<timestamp>.jsonl."""
    out = folder / model
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"samples_{task}_2026-11-23T10-11-12.123456.jsonl"
    with open(path, "w") as fh:
        for doc_id, value in enumerate(scores):
            fh.write(json.dumps({
                "doc_id": doc_id, "doc": {"question": f"q{doc_id}", "choices": ["a", "b"], "answer": 0},
                "target": "a", "arguments": [["q", " a"], ["q", " b"]], "resps": [[[-1.0, True]], [[-2.0, False]]],
                "filtered_resps": [[-1.0, True], [-2.0, False]], "doc_hash": f"h{doc_id}", "prompt_hash": "p",
                "target_hash": "t", metric: value, "acc_norm": value}) + "\n")
    return str(path)


def test_samples_file_reads_as_scores(tmp_path):
    path = write_samples(tmp_path, "org__model-7b", "mmlu_astronomy", [1.0, 0.0, True, False])
    frame = load_scores(path)
    assert list(frame["model"].unique()) == ["org__model-7b"]
    assert list(frame["item_id"]) == [f"mmlu_astronomy/{i}" for i in range(4)]
    assert frame["score"].tolist() == [1.0, 0.0, 1.0, 0.0] and set(frame["subset"]) == {"mmlu_astronomy"}


def test_samples_files_as_history_for_a_backtest(tmp_path, capsys):
    rng = np.random.default_rng(0)
    ability = rng.normal(size=8)
    difficulty = rng.normal(size=300)
    paths = []
    for m in range(8):
        p = 1 / (1 + np.exp(-(ability[m] - difficulty)))
        paths.append(write_samples(tmp_path, f"model-{m}", "arc_easy", (rng.random(300) < p).astype(float)))
    hist = load_history(paths)
    assert len(hist.models) == 8
    argv = ["backtest", "--scores", paths[0], "--goal", "halfwidth:0.1", "--reps", "2", "--json"]
    for p in paths[1:]:
        argv += ["--history", p]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "history" and out["history"]["mean_models"] == 7 and out["summary"]["coverage"] == 1.0


@pytest.mark.parametrize("line, message", [
    ({"doc": {}}, "no doc_id"),
    ({"doc_id": 0, "acc": "yes"}, "not a number"),
    ({"doc_id": 0, "acc": 1.5}, "not a number"),
    ({"doc_id": 0, "resps": []}, "no metric"),
])
def test_bad_samples_are_one_clear_error(tmp_path, line, message):
    folder = tmp_path / "m"
    folder.mkdir()
    path = folder / "samples_task_2026-01-01T00-00-00.000001.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(InputError, match=message):
        load_scores(str(path))


def test_metric_picks_the_column_and_samples_serve_as_a_bank(tmp_path):
    path = write_samples(tmp_path, "m", "arc_easy", [1.0, 0.0, 1.0], metric="acc")
    with open(path) as fh:
        lines = [json.loads(line) for line in fh]
    for rec in lines:
        rec["acc_norm"] = 1.0 - rec["acc"]
    with open(path, "w") as fh:
        fh.writelines(json.dumps(rec) + "\n" for rec in lines)
    assert load_scores(path)["score"].tolist() == [1.0, 0.0, 1.0]  # the first metric by default
    assert load_scores(path, metric="acc_norm")["score"].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(InputError, match="no metric 'f1'"):
        load_scores(path, metric="f1")
    bank = load_bank(path)
    assert bank.item_ids == ("arc_easy/0", "arc_easy/1", "arc_easy/2")
    assert bank.frame["question"].tolist() == ["q0", "q1", "q2"] and bank.frame["answer"].iloc[0] == 0  # the gold index


def test_question_falls_back_to_the_first_argument():
    from certeval.harnesses.readers import _lm_eval_question

    assert _lm_eval_question({"doc": {"x": 1}, "arguments": [["Context: 2+2=", " 4"]]}) == "Context: 2+2="
    assert _lm_eval_question({"doc": {}, "arguments": {"gen_args_0": {"arg_0": "Q?", "arg_1": {}}}}) == "Q?"


@pytest.mark.slow
def test_imported_lm_eval_scores_run_certify_replay_with_history(infra, tmp_path, capsys):
    """``certeval import lm-eval`` output as a replay model, the samples file as the bank, and other models'
    samples files as --history, through the real pipeline (Prefect + Ray)."""
    rng = np.random.default_rng(5)
    ability, difficulty = rng.normal(size=6), rng.normal(size=240)
    paths = [write_samples(tmp_path / "lm", f"model-{m}", "arc_easy",
                           (rng.random(240) < 1 / (1 + np.exp(-(ability[m] - difficulty)))).astype(float))
             for m in range(6)]
    out = tmp_path / "scores.parquet"
    assert main(["import", "lm-eval", *paths, "-o", str(out), "--items", str(tmp_path / "items.parquet")]) == 0
    capsys.readouterr()
    argv = ["certify", "--model", f"replay:{out}#model-0", "--bank", paths[0], "--goal", "halfwidth:0.15",
            "--output", str(tmp_path / "runs"), "--ray-address", infra, "--batch-size", "40", "--json"]
    for p in paths[1:]:
        argv += ["--history", p]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    truth = float(load_scores(paths[0])["score"].mean())
    m = res["models"][0]
    assert m["method"] == "history" and m["history"]["n_models"] == 5 and m["lower"] <= truth <= m["upper"]


def test_import_writes_both_outputs_or_neither(tmp_path, monkeypatch, capsys):
    """A failure writing the second output (here a full disk) leaves neither output nor any temporary behind."""
    import certeval.storage as storage

    paths = [write_samples(tmp_path / "lm", f"model-{m}", "arc_easy", [1.0, 0.0, float(m % 2)]) for m in range(2)]
    real, calls = storage.stage_file, []

    def second_fails(target, data):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(target, data)

    monkeypatch.setattr(storage, "stage_file", second_fails)
    out, items = tmp_path / "out" / "s.parquet", tmp_path / "out" / "items.parquet"
    code = main(["import", "lm-eval", *paths, "-o", str(out), "--items", str(items)])
    assert code == 3 and "No space left" in capsys.readouterr().err
    assert len(calls) == 2 and not out.exists() and not items.exists()
    assert not (tmp_path / "out").exists()  # no temporaries either, nor the folder made for the outputs
    monkeypatch.setattr(storage, "stage_file", real)
    assert main(["import", "lm-eval", *paths, "-o", str(out), "--items", str(items)]) == 0
    assert load_scores(str(out))["model"].nunique() == 2 and items.exists()


def _samples_file(tmp_path, records) -> str:
    folder = tmp_path / "lm" / "org__model"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl"
    path.write_text("".join(json.dumps({"doc_id": k, "doc": {"question": f"q{k}"}, "acc": 1.0, **rec}) + "\n"
                            for k, rec in enumerate(records)))
    return str(path)


def test_a_multiple_choice_samples_file_is_a_bank_scored_as_lm_eval_scored_it(tmp_path):
    """lm-eval's exact context (few-shot and all) is the prompt, the continuations without its ' ' delimiter the
    choices, the gold the answer: certeval's mc-loglik asks the model the same requests (an import once dropped
    the choices and scored SmolLM2 0 of 10 by free generation against "3")."""
    from certeval.scoring import scorers as sc

    context = "Q: 1+1?\nA: 2\n\nQ: 2+3?\nA:"
    record = {"arguments": {f"gen_args_{i}": {"arg_0": context, "arg_1": f" {c}"} for i, c in enumerate("4567")},
              "target": 1}
    bank = load_bank(_samples_file(tmp_path, [record]))
    item = bank.frame.iloc[0].to_dict()
    assert item["prompt"] == context and list(item["choices"]) == ["4", "5", "6", "7"] and item["answer"] == 1
    assert list(item["gold"]) == [1]  # lm-eval's gold index, kept as the index
    assert sc.mc_request(item) == (context, [" 4", " 5", " 6", " 7"])  # lm-eval's own requests
    columns = [c for c in bank.frame.columns if bank.frame[c].notna().any()]
    assert sc.resolve_scorer(None, columns).name == "mc-loglik"


def test_acc_norm_is_lm_evals_length_in_characters():
    from certeval.scoring import scorers as sc

    item = {"item_id": "x", "choices": ["a", "bbbb"], "answer": 1}
    # lm-eval: -1/1 < -3/4, so choice 1; per byte with the delimiter (-1/2 > -3/5) it would be choice 0
    assert sc.get_scorer("mc-loglik-norm").judge([-1.0, -3.0], item) == 1.0


@pytest.mark.parametrize("record, message", [
    ({"arguments": [["Q:", "\n4"], ["Q:", "\n5"]], "target": 0}, "delimiter"),
    ({"arguments": [["Q:", " 4"], ["Q:", " 5"]], "target": "[0, 2]"}, "no index among its 2 choices"),
    ({"arguments": [["Q:", " 4"], ["Q:", " 5"]], "target": "6"}, "no index among its 2 choices"),
    ({"arguments": [["Q:", " 4"], ["Q:", " 5"]], "target": "five"}, "none of its 2 choices"),
    ({"arguments": [["Q: 2+2=", " 4"]], "target": " 4"}, "cannot score"),
])
def test_requests_certeval_cannot_score_as_lm_eval_did_are_refused(tmp_path, record, message):
    with pytest.raises(InputError, match=message):
        load_bank(_samples_file(tmp_path, [record]))


def test_generate_until_items_need_a_scorer_named_by_the_user(tmp_path):
    from certeval.scoring import scorers as sc

    record = {"arguments": [["Q: capital of France?\nA:", {"until": ["\n"]}]], "target": "Paris"}
    bank = load_bank(_samples_file(tmp_path, [record]))
    columns = [c for c in bank.frame.columns if bank.frame[c].notna().any()]
    with pytest.raises(InputError, match="--scorer"):
        sc.resolve_scorer(None, columns)
    assert sc.resolve_scorer("exact", columns).name == "exact"
    assert bank.frame["prompt"].iloc[0] == "Q: capital of France?\nA:" and bank.frame["answer"].iloc[0] == "Paris"
