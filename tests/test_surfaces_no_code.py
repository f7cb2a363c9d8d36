"""No code the user did not ask for (issue 48, class 2).

A checkpoint whose folder asks for its own code (``auto_map`` in its config or tokenizer config) is refused unless
``--trust-remote-code``; a stored run's task reference, metric, filter or scorer name is never imported, and never
opened as a path, by ``rescore``, ``report`` or ``--history``: only names in certeval's and lm-eval's registries
are used. Every planted module or script here writes a marker file when it runs; no case may leave that marker.

Each refusal: exit 2, one stderr line naming the flag (or the stored name) and echoing the value, nothing written,
no process left. The cases a run folder cannot refuse (``report`` of a run naming a custom scorer) finish as usual
and import nothing. In-process, no Ray or Prefect.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from surface_table_support import assert_refused, children, listing, no_new_children, run_cli

pytest.importorskip("lm_eval")

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
def judge(prediction, item):
    return 1.0
def doc_to_text(doc):
    return "x"
class EvilModel:
    pass
"""


def _scoring(metric: str = "exact_match", filt: str = "take_first") -> str:
    return json.dumps({"metrics": [{"name": metric, "kwargs": {}}],
                       "filters": [{"name": "none", "components": [[filt, {}]]}],
                       "multiple_target": False, "task": "t", "doc": {}, "gold": "a", "cast_gold": False})


def _bank(path: Path, scoring: str) -> str:
    rows = [{"item_id": f"t/{i}", "question": f"q{i}", "answer": "a", "prompt": f"q{i}",
             "lm_eval_scoring": scoring, "lm_eval_generation": json.dumps({"until": ["\n"], "max_gen_toks": 8})}
            for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _stored_run(root: Path, run_id: str, bank: str, model_dir: Path) -> Path:
    """A finished certify run with recorded outputs, made in this process (no Ray): the run loop with the rescore's
    recorded-output pool standing in for the model."""
    from certeval.engine import play
    from certeval.reports.rescore import RecordedOutputs
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan
    from certeval.runs.round_steps import RunSteps
    from certeval.runs.run import Run
    from certeval.scoring import scorers as sc

    plan, prepared = make_plan(Certify(models=[f"hf:{model_dir}"], bank=bank, goal="halfwidth:0.1",
                                           method="uniform", batch_size=4, max_items=8, scorer="exact",
                                           output=str(root), run_id=run_id))
    outputs = {(plan.labels[0], f"t/{i}"): "a" for i in range(8)}
    run = Run.open(plan, prepared)
    try:
        run.embed()
        run.restore()
        play(RunSteps(run, RecordedOutputs(outputs, sc.get_scorer("exact"))))
        run.results()
    finally:
        if run.owns_lock:
            run.store.release_lock()
    return root / run_id


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("nocode")
    marker = d / "MARKER"
    evil = EVIL.format(marker=str(marker))
    plain = d / "models" / "plain"
    plain.mkdir(parents=True)
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for name, where in (("auto-config", "config.json"), ("auto-tokenizer", "tokenizer_config.json")):
        folder = d / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (folder / where).write_text(json.dumps({"model_type": "llama", "auto_map": {
            "AutoModelForCausalLM": "modeling_evil.EvilModel", "AutoTokenizer": ["modeling_evil.EvilModel", None]}}))
        (folder / "modeling_evil.py").write_text(evil)
    (d / "evil.py").write_text(evil)  # a 'metric' HF evaluate would import from its path
    plugins = d / "plugins"
    plugins.mkdir()
    (plugins / "evil_mod.py").write_text(evil)
    hooks = d / "hooked"
    hooks.mkdir()
    (hooks / "hooks.py").write_text(evil)
    (hooks / "hooked.yaml").write_text("task: hooked\ndataset_path: json\ndoc_to_text: !function hooks.doc_to_text\n")

    runs = d / "runs"
    out = {"marker": str(marker), "root": str(d), "plugins": str(plugins), "runs": str(runs),
           "plain": str(plain), "auto_config": str(d / "models" / "auto-config"),
           "auto_tokenizer": str(d / "models" / "auto-tokenizer"), "evil": str(d / "evil.py")}
    for name, scoring in (("metric-path", _scoring(metric=str(d / "evil.py"))),
                          ("metric-unregistered", _scoring(metric="my_metric")),
                          ("filter-path", _scoring(filt=str(d / "evil.py"))),
                          ("filter-custom", _scoring(filt="custom")),
                          ("plain", _scoring())):
        # the run is made on a plain bank (a run reading the planted names is refused when it plans), and the
        # stored bank then names them, as a bank edited after its run would
        bank = _bank(d / f"{name}.bank.jsonl", _scoring())
        out[f"run_{name}"] = str(_stored_run(runs, name, bank, plain))
        _bank(Path(bank), scoring)
    for name, changes in (("yaml-bank", {"bank": str(hooks / "hooked.yaml")}),
                          ("names-bank", {"bank": f"lm-eval:hooked?include_path={hooks}"}),
                          ("custom-scorer", {"scorer": "evil_mod:judge"}),
                          ("spec-scorer", {"models": [f"hf:{plain}?scorer=evil_mod:judge"]})):
        folder = runs / name
        shutil.copytree(out["run_plain"], folder)
        _edit_config(folder, run_id=name, **changes)
        out[f"run_{name}"] = str(folder)
    assert not marker.exists()
    return out


def _select(fx, key: str, *extra: str) -> list[str]:
    return ["select", "--checkpoints", fx[key], "--bank", fx["root"] + "/plain.bank.jsonl", *extra]


# (case id, argv builder, expected exit, the flag or name the line holds, the value it echoes)
CASES = [
    ("checkpoint-auto-map-in-config", lambda fx: _select(fx, "auto_config"), 2, "--trust-remote-code",
     lambda fx: fx["auto_config"]),
    ("checkpoint-auto-map-in-tokenizer", lambda fx: _select(fx, "auto_tokenizer"), 2, "--trust-remote-code",
     lambda fx: "tokenizer_config.json"),
    ("model-hf-auto-map", lambda fx: ["certify", "--model", f"hf:{fx['auto_config']}", "--goal", "halfwidth:0.1",
                                      "--bank", fx["root"] + "/plain.bank.jsonl"], 2, "--trust-remote-code",
     lambda fx: fx["auto_config"]),
    ("model-args-pretrained-auto-map", lambda fx: ["certify", "--model", "hf", "--model_args",
                                                   f"pretrained={fx['auto_config']}", "--goal", "halfwidth:0.1",
                                                   "--bank", fx["root"] + "/plain.bank.jsonl"], 2,
     "--trust-remote-code", lambda fx: fx["auto_config"]),
    ("trust-false-spelled-out", lambda fx: ["certify", "--model", f"hf:{fx['auto_config']}?trust_remote_code=false",
                                            "--goal", "halfwidth:0.1", "--bank", fx["root"] + "/plain.bank.jsonl"], 2,
     "--trust-remote-code", lambda fx: fx["auto_config"]),
    ("rescore-metric-a-path", lambda fx: ["rescore", fx["run_metric-path"], "--scorer", "lm-eval"], 2, "metric",
     lambda fx: fx["evil"]),
    ("rescore-metric-unregistered", lambda fx: ["rescore", fx["run_metric-unregistered"], "--scorer", "lm-eval"], 2,
     "metric", lambda fx: "my_metric"),
    ("rescore-filter-a-path", lambda fx: ["rescore", fx["run_filter-path"], "--scorer", "lm-eval"], 2, "filter",
     lambda fx: fx["evil"]),
    ("rescore-filter-custom", lambda fx: ["rescore", fx["run_filter-custom"], "--scorer", "lm-eval"], 2, "filter",
     lambda fx: "custom"),
    ("rescore-choice-names-a-path", lambda fx: ["rescore", fx["run_plain"], "--scorer",
                                                f"lm-eval:{fx['evil']},none"], 2, "scorer", lambda fx: fx["evil"]),
    ("rescore-bank-a-task-yaml", lambda fx: ["rescore", fx["run_yaml-bank"], "--scorer", "exact"], 2, "lm-eval task",
     lambda fx: "hooked.yaml"),
    ("rescore-bank-task-names", lambda fx: ["rescore", fx["run_names-bank"], "--scorer", "exact"], 2, "lm-eval task",
     lambda fx: "lm-eval:hooked"),
]

# the run folder names code, and the command must simply not run it: (case id, argv builder, allowed exits)
QUIET_CASES = [
    ("rescore-run-config-names-custom-scorer", lambda fx: ["rescore", fx["run_custom-scorer"], "--scorer", "exact",
                                                           "--output", fx["root"] + "/rescored-1"], (0, 1)),
    ("rescore-model-spec-names-custom-scorer", lambda fx: ["rescore", fx["run_spec-scorer"], "--scorer", "exact",
                                                           "--output", fx["root"] + "/rescored-2"], (0, 1)),
    ("report-of-a-run-naming-hooks-and-scorers", lambda fx: ["report", fx["run_yaml-bank"]], (0,)),
    ("history-run-folder-naming-a-task-yaml", lambda fx: [
        "rank", "--model", "replay:bundled:helm_mmlu#openai_ada", "--model", "replay:bundled:helm_mmlu#openai_davinci",
        "--dry-run", "--history", fx["run_yaml-bank"], "--output", fx["root"] + "/none"], (2,)),
]


@pytest.fixture()
def planted(fx, monkeypatch, tmp_path):
    """The planted module importable (as if beside the run), the working folder empty, the marker absent."""
    monkeypatch.syspath_prepend(fx["plugins"])
    monkeypatch.chdir(tmp_path)
    yield
    sys.modules.pop("evil_mod", None)
    assert not Path(fx["marker"]).exists(), "planted code ran"


@pytest.mark.parametrize("case_id,build,want,flag,echo", CASES, ids=[c[0] for c in CASES])
def test_code_the_user_did_not_ask_for_is_refused_unrun(case_id, build, want, flag, echo, fx, planted, tmp_path,
                                                        capsys):
    watched = (tmp_path, Path(fx["root"]))
    before, procs = listing(*watched), children()
    code, lines, _ = run_cli(build(fx), capsys)
    assert_refused(case_id, code, lines, want=want, flag=flag, echo=echo(fx))
    assert listing(*watched) == before, f"{case_id}: something was written"
    assert not no_new_children(procs)
    assert not Path(fx["marker"]).exists(), f"{case_id}: planted code ran"


@pytest.mark.parametrize("case_id,build,wants", QUIET_CASES, ids=[c[0] for c in QUIET_CASES])
def test_names_a_run_folder_holds_are_never_imported(case_id, build, wants, fx, planted, capsys):
    procs = children()
    code, lines, _ = run_cli(build(fx), capsys)
    assert code in wants, (case_id, code, lines)
    assert "Traceback" not in "\n".join(lines) and len(lines) <= 1, (case_id, lines)
    assert not no_new_children(procs)
    assert not Path(fx["marker"]).exists(), f"{case_id}: planted code ran"
    assert "evil_mod" not in sys.modules


def test_trust_remote_code_is_the_users_explicit_choice(fx, planted, tmp_path):
    """With --trust-remote-code the same folders pass validation (the flag reaches the model as its option); the
    check itself imports nothing."""
    from argparse import Namespace

    from certeval.cli.pipeline import plan_from_args

    args = Namespace(command="select", models=None, checkpoints=[fx["auto_config"], fx["auto_tokenizer"]],
                     model_args=None, trust_remote_code=True, bank=fx["root"] + "/plain.bank.jsonl",
                     include_path=None, num_fewshot=None, output=str(tmp_path / "runs"), run_id=None, goal=None,
                     method=None, confidence=0.95, batch_size=4, max_items=None, seed=0, scorer="exact",
                     ray_address=None, replicas=1, num_gpus=0.0, in_flight=1, num_cpus=None, aggregate=None,
                     history=None, target=None, threshold=None, halfwidth=None, top=None, mode="best")
    plan, _ = plan_from_args(args)
    assert all("trust_remote_code=true" in m for m in plan.models) and len(plan.models) == 2
    assert not Path(fx["marker"]).exists() and list(tmp_path.iterdir()) == []
