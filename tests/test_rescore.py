"""Generation kept apart from judging: a real small LM's outputs are stored with every score, the
``--log_samples`` file carries them, and ``certeval rescore`` re-judges a stored run with another scorer without
calling any model (the backend call log stays as it was), into a new run folder.

Real parts only: SmolLM2-135M on CPU behind Prefect + Ray, the bundled trivia bank, the built-in scorers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from certeval.cli import main
from certeval.scoring import scorers as sc

from test_pipeline_support import MIDDLE, needs_small_lm, read_log, replay

pytestmark = pytest.mark.slow

TRIVIA = "bundled:trivia?categories=uscapitals"
TWO = "bundled:trivia?categories=uscapitals,worldcapitals"


def needs_rationale(prediction, item):  # a custom scorer asking for a field the trivia bank lacks
    return 1.0


needs_rationale.required_fields = [("rationale",)]


def uneven(prediction, item):  # a synthetic judgement: about half right in one stratum, nothing in the other
    return float(item["subset"] == "uscapitals" and int(item["item_id"][-1], 16) % 2 == 0)


def _lm_available() -> None:
    needs_small_lm()


def _rows(folder: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((folder / "rounds").glob("*.parquet"))], ignore_index=True)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


def _items(bank: str) -> dict[str, dict]:
    from certeval.runs.inputs import load_run_bank
    from certeval.runs.run_requests import _item_record

    loaded = load_run_bank(bank, ("hf:bundled:smollm2",))
    return {loaded.item_ids[p]: _item_record(loaded.frame, p) for p in range(loaded.n_items)}


@pytest.fixture(scope="module")
def lm_run(infra, kept_actors, tmp_path_factory):
    """A stored hf run (uniform, normalized scorer) with --log_samples, and the backend call log it wrote. Its
    SmolLM2 actor is kept: the module's later runs on that model adopt it instead of loading the model again."""
    _lm_available()
    root = tmp_path_factory.mktemp("rescore")
    log = root / "calls.log"
    code = main(["certify", "--model", "hf:bundled:smollm2", "--bank", TRIVIA, "--goal", "halfwidth:0.1",
                 "--method", "uniform", "--batch-size", "4", "--max-items", "8", "--seed", "0",
                 "--output", str(root / "runs"), "--run-id", "lm", "--ray-address", infra, "--log_samples",
                 "--call-log", str(log), "--keep-actors"])
    assert code == 1  # the budget (8 items) runs out before a half-width of 0.1
    return root, log


def test_an_hf_run_keeps_outputs_and_prompt_hashes_in_rounds_cache_and_samples(lm_run):
    root, log = lm_run
    folder = root / "runs" / "lm"
    rows = _rows(folder)
    res = json.loads((folder / "results.json").read_text())
    assert len(rows) == res["models"][0]["n_scored"] == 8 and len(read_log(log)) == 8
    assert {"output", "prompt_hash"} <= set(rows.columns)
    assert all(isinstance(o, str) and o.strip() for o in rows["output"])  # every scored item: its answer
    from certeval.storage import prompt_hash

    items = _items(TRIVIA)
    assert list(rows["prompt_hash"]) == [prompt_hash(items[i]) for i in rows["item_id"]]
    normalized = sc.get_scorer("normalized")  # the stored score is the run's scorer's judgement of the output
    assert list(rows["score"]) == [sc.judge(normalized, o, items[i]) for o, i in zip(rows["output"], rows["item_id"])]
    # the score cache keeps them too
    parts = pd.concat([pd.read_parquet(p) for p in (root / "runs" / "_cache").rglob("parts/*.parquet")])
    cached = dict(zip(parts["item_id"], parts["output"]))
    assert {i: cached[i] for i in rows["item_id"]} == dict(zip(rows["item_id"], rows["output"]))
    assert set(rows["prompt_hash"]) <= set(parts["prompt_hash"])
    # --log_samples: exactly one line per scored item, carrying the output as lm-eval's resps / filtered_resps
    files = list((folder / "samples").rglob("samples_*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    assert len(lines) == len(rows) and sorted(x["item_id"] for x in lines) == sorted(rows["item_id"])
    by_id = dict(zip(rows["item_id"], rows["output"]))
    for line in lines:
        assert line["resps"] == [[by_id[line["item_id"]]]] and line["filtered_resps"] == [by_id[line["item_id"]]]


def test_rescore_rejudges_without_calling_the_model_into_a_new_run(lm_run, capsys):
    root, log = lm_run
    source = root / "runs" / "lm"
    before, calls = _digest(source), read_log(log)
    code = main(["rescore", str(source), "--scorer", "exact", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and read_log(log) == calls  # no model was asked anything
    assert _digest(source) == before  # the source run is untouched
    new = root / "runs" / "lm-rescore-exact"
    assert out["run_folder"] == str(new)
    stored = json.loads((new / "results.json").read_text())
    assert stored["scorer"] == "exact" and stored["rescore"]["source_run"] == str(source)
    assert stored["rescore"]["source_scorer"] == "normalized" and stored["rescore"]["model_calls"] == 0
    assert stored["models"][0]["items_sent_to_model"] == 0
    assert json.loads((new / "config.json").read_text())["scorer"] == "exact"
    rows, old = _rows(new), _rows(source)
    assert list(rows["item_id"]) == list(old["item_id"]) and list(rows["round"]) == list(old["round"])
    assert list(rows["output"]) == list(old["output"]) and list(rows["prompt_hash"]) == list(old["prompt_hash"])
    items = _items(TRIVIA)
    exact = sc.get_scorer("exact")
    expected = [sc.judge(exact, o, items[i]) for o, i in zip(old["output"], old["item_id"])]
    assert list(rows["score"]) == expected
    # the interval is the method's, fed the recorded items in the recorded order with the new scores
    from certeval.estimators import method_for_goal, parse_goal
    from certeval.runs.inputs import load_run_bank

    bank = load_run_bank(TRIVIA, ("hf:bundled:smollm2",))
    # built as the run built it: bets tuned to its goal (halfwidth:0.1)
    method = method_for_goal("uniform", parse_goal("halfwidth:0.1"), 8, confidence=0.95).start(bank.spec())
    for _round, part in old.groupby("round", sort=True):
        method.update(bank.positions(part["item_id"]), np.array([expected[k] for k in part.index], float))
    est = method.result()
    m = stored["models"][0]
    assert (m["mean"], m["lower"], m["upper"]) == pytest.approx((est.mean, est.lower, est.upper))
    assert (new / "manifest.json").exists() and not list(new.rglob("*.tmp"))
    assert main(["report", str(new)]) == 0 and (new / "report.md").exists()  # a run folder like any other
    capsys.readouterr()
    # the same scorer again reproduces the source run's result exactly
    assert main(["rescore", str(source), "--scorer", "normalized", "--run-id", "same", "--json"]) == 1
    again = json.loads(capsys.readouterr().out)["models"][0]
    first = json.loads((source / "results.json").read_text())["models"][0]
    assert (again["mean"], again["lower"], again["upper"]) == (first["mean"], first["lower"], first["upper"])
    assert read_log(log) == calls


def _target(root, kind: str) -> str:
    """An --output folder (outside the runs the test digests) where something already stands at the run id."""
    out = root / f"targets-{kind}"
    out.mkdir(exist_ok=True)
    if kind == "stray":
        (out / "stray" / "rounds").mkdir(parents=True, exist_ok=True)
        (out / "stray" / "rounds" / "0.parquet").write_bytes(b"a round from elsewhere")
    elif not (out / "linked").is_symlink():
        (root / "elsewhere").mkdir(exist_ok=True)
        (out / "linked").symlink_to(root / "elsewhere", target_is_directory=True)
    return str(out)


@pytest.mark.parametrize("case, argv, needle", [
    ("no-such-run", lambda src, root: [str(root / "nope"), "--scorer", "exact", "--run-id", "bad"], "no run at"),
    ("unknown-scorer", lambda src, root: [src, "--scorer", "fuzzy", "--run-id", "bad"], "unknown scorer 'fuzzy'"),
    ("loglik-scorer", lambda src, root: [src, "--scorer", "mc-loglik", "--run-id", "bad"], "'mc-loglik' judges per-choice"),
    ("missing-field", lambda src, root: [src, "--scorer", f"{__name__}:needs_rationale", "--run-id", "bad"], "'rationale'"),
    ("existing-target", lambda src, root: [src, "--scorer", "exact", "--run-id", "lm"], "already exists"),
    # a folder without config.json (a stray round in it was adopted) and a link to elsewhere (followed)
    ("stray-target", lambda src, root: [src, "--scorer", "exact", "--output", _target(root, "stray"), "--run-id",
                                        "stray"], "already exists"),
    ("linked-target", lambda src, root: [src, "--scorer", "exact", "--output", _target(root, "linked"), "--run-id",
                                         "linked"], "already exists"),
])
def test_rescore_bad_input_exits_2_with_one_line_and_writes_nothing(lm_run, capsys, case, argv, needle):
    root, log = lm_run
    runs = root / "runs"
    before, calls = _digest(runs), read_log(log)
    assert main(["rescore", *argv(str(runs / "lm"), root)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert _digest(runs) == before and read_log(log) == calls and not (runs / "bad").exists()
    assert not (root / "elsewhere").exists() or not any((root / "elsewhere").iterdir())  # nothing written via a link
    assert not (root / "targets-stray").exists() or sorted(p.name for p in (root / "targets-stray" / "stray").rglob(
        "*")) == ["0.parquet", "rounds"]


def test_replay_runs_store_null_outputs_and_cannot_be_rescored(infra, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.3", "--method", "uniform",
                 "--batch-size", "20", "--output", str(runs), "--run-id", "rp", "--ray-address", infra, "--json"]) == 0
    capsys.readouterr()
    rows = _rows(runs / "rp")
    assert rows["output"].isna().all() and rows["prompt_hash"].isna().all()  # null, never a made-up string
    parts = pd.concat([pd.read_parquet(p) for p in (runs / "_cache").rglob("parts/*.parquet")])
    assert parts["output"].isna().all()
    before = _digest(runs)
    assert main(["rescore", str(runs / "rp"), "--scorer", "exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no output for model" in err and "replay" in err and len(err.splitlines()) == 1
    assert _digest(runs) == before
    # a run stored before outputs were kept (no such columns) still reads, and is refused by name; its rounds are
    # rewritten as such a run wrote them, each with its manifest entry (rescore checks the record first)
    from certeval.storage import RunStore

    old_store = RunStore(str(runs), "rp")
    for p in sorted((runs / "rp" / "rounds").glob("*.parquet")):
        old_store.write_round(int(p.stem), pd.read_parquet(p).drop(columns=["output", "prompt_hash"]))
    from certeval.reports.run_report import load_run

    assert len(load_run(str(runs / "rp")).rounds) == len(rows)
    assert main(["rescore", str(runs / "rp"), "--scorer", "exact"]) == 2
    assert "keeps no model outputs" in capsys.readouterr().err


def test_score_dependent_selection_replays_until_the_record_ends(lm_run, infra, capsys):
    """adaptive allocates items to strata from the scores it saw: re-run with other scores it may ask for items
    the source never scored. The rescore follows it exactly while it asks for recorded items, then stops with
    rule 'recorded' (anytime-valid at that stopping time); every absorbed round is a recorded round."""
    root, log = lm_run
    runs = root / "runs"
    # a budget of 64: bets tuned to a 32-item horizon are large enough that adaptive draws ∝ weight throughout
    # (score-independent); at 64 its Neyman draws follow the scores after 12 items
    assert main(["certify", "--model", "hf:bundled:smollm2", "--bank", TWO, "--goal", "halfwidth:0.05",
                 "--method", "adaptive", "--batch-size", "4", "--max-items", "64", "--seed", "1",
                 "--output", str(runs), "--run-id", "ad", "--ray-address", infra, "--call-log", str(log),
                 "--keep-actors"]) == 1
    capsys.readouterr()
    calls = read_log(log)
    scorer = f"{__name__}:uneven"
    assert main(["rescore", str(runs / "ad"), "--scorer", scorer, "--run-id", "ad-long", "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert read_log(log) == calls
    old, new = _rows(runs / "ad"), _rows(runs / "ad-long")
    items = _items(TWO)
    assert list(new["score"]) == [uneven(o, items[i]) for o, i in zip(new["output"], new["item_id"])]
    for r, part in new.groupby("round"):  # each absorbed round: exactly the source's items of that round
        assert list(part["item_id"]) == list(old[old["round"] == r]["item_id"])
    m = res["models"][0]
    assert m["anytime_valid"] and m["n_scored"] == len(new)
    stops = res["rescore"]["stopped_at_record_end"]
    # here the new scores move adaptive's allocation: the replay ends where the record does
    assert len(new) < len(old) and m["decision"]["rule"] == "recorded"
    assert stops == {m["model"]: int(new["round"].max()) + 1}
    # the rescored interval is a fresh adaptive fed those rounds with the new scores (same seed, same draws)
    from certeval.estimators import method_for_goal, parse_goal
    from certeval.runs.inputs import load_run_bank

    bank = load_run_bank(TWO, ("hf:bundled:smollm2",))
    method = method_for_goal("adaptive", parse_goal("halfwidth:0.05"), 64, confidence=0.95).start(bank.spec())
    for r, part in new.groupby("round", sort=True):
        proposed = method.propose(4, np.random.default_rng([1, int(r)]))
        assert [bank.item_ids[p] for p in proposed.items] == list(part["item_id"])
        method.update(bank.positions(part["item_id"]), part["score"].to_numpy(float))
    est = method.result()
    assert (m["mean"], m["lower"], m["upper"]) == pytest.approx((est.mean, est.lower, est.upper))


def test_outputs_answered_from_the_score_cache_are_kept_too(lm_run, infra, capsys):
    """Another run under the same root: the items already paid for come from the cache, with their outputs."""
    root, log = lm_run
    runs = root / "runs"
    calls = read_log(log)
    assert main(["certify", "--model", "hf:bundled:smollm2", "--bank", TRIVIA, "--goal", "halfwidth:0.1",
                 "--method", "uniform", "--batch-size", "4", "--max-items", "12", "--seed", "0",
                 "--output", str(runs), "--run-id", "lm-more", "--ray-address", infra, "--json", "--call-log", str(log),
                 "--keep-actors"]) == 1
    res = json.loads(capsys.readouterr().out)
    sent = res["models"][0]["items_sent_to_model"]  # at most the 4 new items (other tests may have paid for some)
    assert sent <= 4 and len(read_log(log)) == len(calls) + sent
    first, more = _rows(runs / "lm"), _rows(runs / "lm-more")
    assert len(more) == 12 and all(isinstance(o, str) and o.strip() for o in more["output"])
    cached = more[more["item_id"].isin(set(first["item_id"]))]
    assert len(cached) == 8
    assert dict(zip(cached["item_id"], cached["output"])) == dict(zip(first["item_id"], first["output"]))


def test_a_corrected_answer_key_is_rejudged_but_a_changed_question_is_refused(infra, kept_actors, tmp_path, capsys):
    """The prompt hash covers what the model was shown, not the accepted answers: a bank whose answers were
    corrected since the run is re-judged against them; one whose question changed is refused by item."""
    _lm_available()
    bank = tmp_path / "qa.jsonl"
    qa = [("What is the capital city of Italy?", ["Rome"]), ("How many days are in a week?", ["7", "seven"]),
          ("What colour is the sky on a clear day?", ["blue"]), ("Who wrote Hamlet?", ["William Shakespeare"])]

    def write(rows):
        bank.write_text("".join(json.dumps({"item_id": f"q{i}", "question": q, "answers": a}) + "\n"
                                for i, (q, a) in enumerate(rows)))

    write(qa)
    runs = tmp_path / "runs"
    main(["certify", "--model", "hf:bundled:smollm2", "--bank", str(bank), "--goal", "halfwidth:0.1",
          "--method", "uniform", "--batch-size", "4", "--output", str(runs), "--run-id", "qa",
          "--ray-address", infra, "--json", "--keep-actors"])
    capsys.readouterr()
    old = _rows(runs / "qa").set_index("item_id")
    said = old.loc["q3", "output"]
    write(qa[:3] + [(qa[3][0], [said])])  # the answer key now accepts what the model said
    assert main(["rescore", str(runs / "qa"), "--scorer", "normalized", "--run-id", "fixed", "--json"]) in (0, 1)
    capsys.readouterr()
    new = _rows(runs / "fixed").set_index("item_id")
    assert new.loc["q3", "score"] == 1.0
    assert (new.drop(index="q3")["score"] == old.drop(index="q3")["score"]).all()
    write(qa[:1] + [("How many days are in a fortnight?", qa[1][1])] + qa[2:])
    before = _digest(runs)
    assert main(["rescore", str(runs / "qa"), "--scorer", "normalized", "--run-id", "changed"]) == 2
    err = capsys.readouterr().err.strip()
    assert "item 'q1'" in err and "prompt hash" in err and len(err.splitlines()) == 1
    assert _digest(runs) == before


def test_a_scorer_named_by_a_stored_run_is_never_imported(lm_run, tmp_path, monkeypatch, capsys):
    """A run folder is data: a config naming ``module:function`` as its scorer must not make rescore import that
    module (importing runs its code). The planted module writes a marker file when imported."""
    import shutil

    root, _ = lm_run
    src = tmp_path / "handed-over"
    shutil.copytree(root / "runs" / "lm", src)
    marker = tmp_path / "imported.marker"
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "certeval_planted_scorer.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n\ndef judge(prediction, item):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(mods))
    config = json.loads((src / "config.json").read_text())
    config["scorer"] = "certeval_planted_scorer:judge"
    config["models"] = [m.split("?")[0] + "?scorer=certeval_planted_scorer:judge" for m in config["models"]]
    (src / "config.json").write_text(json.dumps(config))
    main(["rescore", str(src), "--scorer", "exact", "--output", str(tmp_path / "out")])
    capsys.readouterr()
    assert not marker.exists(), "rescore imported a module named by the stored run"
    from certeval.inputs.history import load_history

    assert load_history([str(src)]).frame["model"].nunique() == 1  # the same folder as --history: read, not run
    assert not marker.exists(), "--history imported a module named by the stored run"
    import importlib

    importlib.import_module("certeval_planted_scorer")  # the control: importing it does leave the marker
    assert marker.exists()


@pytest.mark.parametrize("damage, needle", [
    ("edited-output", "differs from what was written"),  # an edited output was re-judged before
    ("deleted-round", "is missing"),  # a shorter record was re-scored, exit 1, no word
    ("deleted-manifest", "manifest.json is missing"),
])
def test_rescore_and_report_refuse_a_record_that_is_not_what_was_written(lm_run, tmp_path, capsys, damage, needle):
    import shutil

    root, _ = lm_run
    src = tmp_path / "copy"
    shutil.copytree(root / "runs" / "lm", src)
    rounds = sorted((src / "rounds").glob("*.parquet"))
    if damage == "edited-output":
        frame = pd.read_parquet(rounds[0])
        frame.loc[0, "output"] = "an answer the model never gave"
        frame.to_parquet(rounds[0], index=False)
    elif damage == "deleted-round":
        rounds[-1].unlink()
    else:
        (src / "manifest.json").unlink()
    code = main(["rescore", str(src), "--scorer", "exact", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
    before = sorted(p.name for p in src.iterdir())
    code = main(["report", str(src)])  # its tables and plots would show a record the run never wrote
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in src.iterdir()) == before


def test_a_run_started_with_relative_paths_is_rescored_from_any_folder(infra, kept_actors, tmp_path, monkeypatch,
                                                                       capsys):
    """config.json keeps the folder a run was started in: a bank named by a relative path is found again when
    the rescore runs elsewhere. The control: the same run without that record is refused in one line."""
    import shutil

    _lm_available()
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "qa.jsonl").write_text("".join(json.dumps({"item_id": f"q{i}", "question": q, "answers": a}) + "\n"
                                           for i, (q, a) in enumerate([("What is the capital city of Italy?", ["Rome"]),
                                                                       ("Who wrote Hamlet?", ["Shakespeare"])])))
    monkeypatch.chdir(work)
    main(["certify", "--model", "hf:bundled:smollm2", "--bank", "qa.jsonl", "--goal", "halfwidth:0.1",
          "--method", "uniform", "--batch-size", "2", "--output", "runs", "--run-id", "rel", "--ray-address", infra,
          "--json", "--keep-actors"])
    capsys.readouterr()
    source = work / "runs" / "rel"
    assert json.loads((source / "config.json").read_text())["bank"] == "qa.jsonl"  # as the user gave it
    monkeypatch.chdir(elsewhere)
    assert main(["rescore", str(source), "--scorer", "exact", "--output", str(elsewhere / "out"), "--json"]) in (0, 1)
    capsys.readouterr()
    new = _rows(elsewhere / "out" / "rel-rescore-exact")
    assert sorted(new["item_id"]) == ["q0", "q1"]
    config = json.loads((elsewhere / "out" / "rel-rescore-exact" / "config.json").read_text())
    assert config["bank"] == str(work / "qa.jsonl")
    # the control: a run stored without its working folder cannot be rescored from elsewhere
    old = tmp_path / "old"
    shutil.copytree(source, old)
    stored = json.loads((old / "config.json").read_text())
    del stored["workdir"]
    (old / "config.json").write_text(json.dumps(stored))
    assert main(["rescore", str(old), "--scorer", "exact", "--output", str(elsewhere / "out2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'qa.jsonl'" in err and "relative path" in err and len(err.splitlines()) == 1, err
    assert not (elsewhere / "out2").exists()


# last, these two: each frees the CPUs the module's kept SmolLM2 actor holds
def test_a_multiple_choice_run_keeps_the_chosen_choice_and_is_not_rejudged(infra, kept_actors, tmp_path, capsys):
    _lm_available()
    kept_actors()  # a multiple-choice bank's scorer is another actor's: the kept one's CPUs back first
    bank = tmp_path / "mc.jsonl"
    rows = [("Which planet is known as the Red Planet?", ["Venus", "Mars", "Jupiter"], 1),
            ("How many legs does a spider have?", ["six", "eight", "ten"], 1),
            ("What is the capital of France?", ["Paris", "Rome", "Berlin"], 0),
            ("Which gas do plants take in?", ["oxygen", "helium", "carbon dioxide"], 2)]
    bank.write_text("".join(json.dumps({"item_id": f"q{i}", "question": q, "choices": c, "answer": a}) + "\n"
                            for i, (q, c, a) in enumerate(rows)))
    runs = tmp_path / "runs"
    main(["certify", "--model", "hf:bundled:smollm2", "--bank", str(bank), "--goal", "halfwidth:0.1",
          "--method", "uniform", "--batch-size", "4", "--output", str(runs), "--run-id", "mc",
          "--ray-address", infra, "--json"])
    capsys.readouterr()
    stored = _rows(runs / "mc")
    choices = {f"q{i}": c for i, (_, c, _) in enumerate(rows)}
    assert len(stored) == 4 and all(o in choices[i] for o, i in zip(stored["output"], stored["item_id"]))
    before = _digest(runs)
    assert main(["rescore", str(runs / "mc"), "--scorer", "exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'mc-loglik'" in err and "nothing to re-judge" in err and len(err.splitlines()) == 1
    assert _digest(runs) == before


def test_a_paired_run_is_rescored_on_its_shared_uniform_order(infra, kept_actors, tmp_path, capsys):
    """compare: both models' outputs judged again; every round holds the same shared items as the source's."""
    _lm_available()
    kept_actors()  # two other actors: the kept one's CPUs back first
    runs, log = tmp_path / "runs", tmp_path / "calls.log"
    main(["compare", "--model", "hf:bundled:smollm2", "--model", "hf:bundled:smollm2?max_new_tokens=3",
          "--bank", TRIVIA, "--batch-size", "4", "--max-items", "8", "--seed", "2", "--output", str(runs),
          "--run-id", "cmp", "--ray-address", infra, "--json", "--call-log", str(log)])
    capsys.readouterr()
    calls = read_log(log)
    assert len(calls) == 16
    main(["rescore", str(runs / "cmp"), "--scorer", "exact", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert read_log(log) == calls
    old, new = _rows(runs / "cmp"), _rows(runs / "cmp-rescore-exact")
    key = ["round", "model", "item_id"]
    assert new[key].values.tolist() == old[key].values.tolist() and list(new["output"]) == list(old["output"])
    items = _items(TRIVIA)
    exact = sc.get_scorer("exact")
    assert list(new["score"]) == [sc.judge(exact, o, items[i]) for o, i in zip(new["output"], new["item_id"])]
    assert res["kind"] == "compare" and res["scorer"] == "exact" and len(res["pairs"]) == 1
    assert all(m["n_scored"] == 8 and m["items_sent_to_model"] == 0 for m in res["models"])
    assert res["rescore"]["stopped_at_record_end"] == {}
