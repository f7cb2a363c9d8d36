"""Runtime flags (certeval.runtime.options): bad values exit 2 with one line naming the flag and echoing the value,
before anything is written; the values reach the actors as constructor arguments; a run resumed with other values
is the same run. No Ray, no Prefect: the end-to-end uses are in test_pipeline_e2e (--batch-timeout, --call-log),
test_faults (--startup-log), test_resume_crash / test_rescore / test_cluster_ray (--call-log)."""

from __future__ import annotations

import json

import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.runtime.options import RuntimeOptions, default_cache_dir, runtime_options

MODEL = "replay:bundled:helm_mmlu#openai_ada"
CERTIFY = ["certify", "--model", MODEL, "--goal", "halfwidth:0.1"]


def _exit_code(argv: list[str]) -> int:
    """main's exit code; argparse's own refusals (a value that is not a number) exit 2 through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _bad_flags(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return [
        (["--batch-timeout", "-1"], "--batch-timeout", "-1"),
        (["--batch-timeout", "abc"], "--batch-timeout", "'abc'"),
        (["--batch-timeout", "nan"], "--batch-timeout", "nan"),
        (["--actor-start-timeout", "0"], "--actor-start-timeout", "0"),
        (["--actor-start-timeout", "inf"], "--actor-start-timeout", "inf"),
        (["--call-log", str(tmp_path / "missing" / "calls.log")], "--call-log", "missing"),
        (["--startup-log", str(tmp_path)], "--startup-log", str(tmp_path)),
        (["--cache-dir", str(a_file)], "--cache-dir", str(a_file)),
    ]


@pytest.mark.parametrize("command", [CERTIFY, ["rank", "--model", MODEL, "--model", MODEL + "x"],
                                     ["demo", "--skip-lm"]])
def test_a_bad_runtime_flag_exits_2_with_one_line_and_writes_nothing(command, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for flags, flag, value in _bad_flags(tmp_path):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        assert _exit_code(command + ["--output", str(work / "runs")] * (command[0] != "demo") + flags) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and flag in err and value in err, (flags, err)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, flags  # no run folder, no .prefect


def test_backtest_checks_its_cache_dir_first(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main(["backtest", "--scores", "bundled:helm_mmlu", "--cache-dir", str(a_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cache-dir" in err and str(a_file) in err


@pytest.mark.parametrize("fields, needle", [
    ({"batch_timeout_s": -1}, "--batch-timeout must be a positive number of seconds, got -1"),
    ({"batch_timeout_s": True}, "--batch-timeout"),
    ({"actor_start_timeout_s": "900"}, "--actor-start-timeout"),
    ({"watchdog": "no"}, "watchdog must be true or false, got 'no'"),
    ({"call_log": ""}, "--call-log must name a file"),
    ({"cache_dir": 3}, "--cache-dir must name a folder, got 3"),
])
def test_options_check_themselves(fields, needle):
    with pytest.raises(InputError, match=needle):
        RuntimeOptions(**fields)


def test_options_from_a_mapping_as_a_deployment_gives_them(tmp_path):
    opts = runtime_options({"batch_timeout_s": 5, "call_log": str(tmp_path / "c.log")})
    assert opts.batch_timeout_s == 5.0 and opts.call_log == str(tmp_path / "c.log") and opts.watchdog
    assert runtime_options(None) == RuntimeOptions() and runtime_options(opts) is opts
    with pytest.raises(InputError, match="unknown option 'batch_timeout'"):
        runtime_options({"batch_timeout": 5})


def test_paths_are_made_absolute_for_actors_that_run_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opts = RuntimeOptions(call_log="calls.log", startup_log="t.tsv", cache_dir="cache")
    assert opts.call_log == str(tmp_path / "calls.log") and opts.startup_log == str(tmp_path / "t.tsv")
    assert opts.cache_path() == tmp_path / "cache"


def test_the_default_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "certeval" == RuntimeOptions().cache_path()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the spec: only an absolute path counts
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "certeval"
    from certeval.inputs.smollm import converted_dir

    assert converted_dir(tmp_path / "c") == tmp_path / "c" / "smollm2"


def test_a_resumed_run_may_change_its_runtime_options(tmp_path):
    """The options are not the run's identity: config.json does not keep them, and another timeout or log is no
    'different config under an existing run id' (a changed seed still is)."""
    from certeval.requests import Certify
    from certeval.runs.plan import claim_run, make_plan

    def plan(seed=0, **options):
        return make_plan(Certify(models=[MODEL], goal="halfwidth:0.1", output=str(tmp_path / "runs"),
                                     run_id="r", seed=seed, options=RuntimeOptions(**options)))[0]

    first = plan(batch_timeout_s=10)
    claim_run(first)
    config = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())
    assert "options" not in config and "batch_timeout_s" not in json.dumps(config)
    again = plan(batch_timeout_s=20, actor_start_timeout_s=5, call_log=str(tmp_path / "c.log"), watchdog=False)
    assert claim_run(again) is True  # another command resuming the run, not refused
    assert again.options.batch_timeout_s == 20.0
    with pytest.raises(InputError, match="seed"):
        claim_run(plan(seed=1))


def test_an_actor_takes_its_call_log_and_timeline_from_its_arguments(tmp_path, monkeypatch):
    """The worker body in-process (no Ray): nothing is read from the environment."""
    from certeval.hosting.worker import ModelWorker
    from certeval.inputs.banks import load_scores
    from certeval.runtime import startup

    monkeypatch.setattr(startup, "_state", {"path": None, "configured": False, "early": []})
    log, timeline = tmp_path / "calls.log", tmp_path / "timeline.tsv"
    ids = list(load_scores("bundled:helm_mmlu")["item_id"].drop_duplicates()[:2])
    worker = ModelWorker({"m": MODEL}, {"m": None}, RuntimeOptions(call_log=str(log), startup_log=str(timeline)))
    worker.score([("m", [{"item_id": i} for i in ids], ["k1", "k2"])])
    assert log.read_text().splitlines() == [f"m\t{i}" for i in ids]
    assert [m[0] for m in startup.read(timeline)] == ["actor_started", "model_loaded", "first_call"]


def test_certeval_variables_no_longer_travel_to_the_actors(monkeypatch):
    from certeval.hosting.ray_setup import _forwarded_env

    monkeypatch.setenv("CERTEVAL_BATCH_TIMEOUT_S", "2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = _forwarded_env()
    assert "CERTEVAL_BATCH_TIMEOUT_S" not in env and env.get("HF_HUB_OFFLINE") == "1"
