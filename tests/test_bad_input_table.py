"""Bad input, every subcommand: exit 2, exactly one line on stderr, nothing written.

Each case runs in-process through ``certeval.cli.main`` from an empty working
folder, with ``--output`` pointing at a folder that must stay absent; after
the call, the working folder must hold exactly the fixture files it held before
(no ``certeval-runs``, no ``.prefect``, no temporaries). Every case fails before
Ray or Prefect start, so the table is fast. A few cases run the real CLI in a
subprocess with no Prefect configuration at all, to check ``./.prefect`` stays
absent there too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_readers import write_samples

from certeval.cli import main

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, str]:
    """Small input files, built once, outside the folders the cases run in."""
    from certeval.inputs.banks import load_scores

    d = tmp_path_factory.mktemp("fixtures")
    frame = load_scores(SCORES)
    ids = list(pd.unique(frame["item_id"]))[:40]
    small = frame[frame["model"].isin([STRONG, MIDDLE, WEAK]) & frame["item_id"].isin(ids)]
    small.to_parquet(d / "small.scores.parquet", index=False)
    bank = pd.DataFrame({"item_id": ids + ["never-scored-item"], "question": ["q"] * (len(ids) + 1),
                         "answer": ["a"] * (len(ids) + 1)})
    bank.to_json(d / "wider.bank.jsonl", orient="records", lines=True)
    (d / "not.parquet").write_bytes(b"this is not parquet")
    (d / "a-file").write_text("a file, not a folder")
    (d / "empty-folder").mkdir()
    run = d / "damaged-run"
    run.mkdir()
    (run / "results.json").write_text('{"run_id": "x", "models": [')  # truncated
    run2 = d / "results-list-run"
    run2.mkdir()
    (run2 / "results.json").write_text("[1, 2, 3]")
    run3 = d / "results-empty-run"
    run3.mkdir()
    (run3 / "results.json").write_text("{}")
    (d / "savings.txt").write_text("not json")
    samples = write_samples(d / "lm", "org__model", "arc_easy", [1.0, 0.0, 1.0])
    os.symlink(samples, d / "link.jsonl")
    (d / "folder.parquet").mkdir()
    (d / "huge.eval").write_bytes(_zip_declaring(4_000_000_000))
    from certeval.storage import RunStore

    round_frame = small[["model", "item_id", "score"]].head(4).reset_index(drop=True)
    for name in ("junk-round-run", "scoreless-round-run", "edited-round-run", "stray-round-run"):
        store = RunStore(str(d), name)  # rounds written as runs write them: each with its manifest entry
        store.folder.write_json("config.json", {"run_id": name, "kind": "certify"})
        store.write_round(0, round_frame.drop(columns="score") if name == "scoreless-round-run" else round_frame)
    manifest = json.loads((d / "junk-round-run" / "manifest.json").read_text())
    (d / "junk-round-run" / "rounds" / "00000.parquet").write_bytes(b"junk")  # manifest updated to match it:
    manifest["rounds"]["00000"].update(bytes=4, sha256=hashlib.sha256(b"junk").hexdigest())  # unreadable Parquet
    (d / "junk-round-run" / "manifest.json").write_text(json.dumps(manifest))
    edited = d / "edited-round-run" / "rounds" / "00000.parquet"
    round_frame.assign(score=1.0).to_parquet(edited, index=False)  # rewritten after the run: not what was written
    shutil.copy(edited, d / "stray-round-run" / "rounds" / "00001.parquet")  # a round the manifest never listed
    latin = d / "lm" / "latin" / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl"
    latin.parent.mkdir(parents=True)
    latin.write_bytes(b'{"doc_id": 0, "acc": 1.0, "doc": {"question": "caf\xe9"}}\n')  # Latin-1, not UTF-8
    (d / "lm" / "folder" / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl").mkdir(parents=True)
    return {"samples": samples, "samples_link": str(d / "link.jsonl"), "folder_parquet": str(d / "folder.parquet"),
            "scores": str(d / "small.scores.parquet"), "wider_bank": str(d / "wider.bank.jsonl"),
            "not_parquet": str(d / "not.parquet"), "file": str(d / "a-file"), "empty": str(d / "empty-folder"),
            "damaged_run": str(run), "huge_eval": str(d / "huge.eval"), "junk_round_run": str(d / "junk-round-run"),
            "scoreless_round_run": str(d / "scoreless-round-run"), "edited_round_run": str(d / "edited-round-run"),
            "stray_round_run": str(d / "stray-round-run"), "latin_samples": str(latin),
            "folder_samples": str(d / "lm" / "folder" / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl"), "list_run": str(run2), "empty_run": str(run3),
            "savings_txt": str(d / "savings.txt"), "closed": f"127.0.0.1:{_closed_port()}",
            "closed_url": f"http://127.0.0.1:{_closed_port()}/v1"}


def _zip_declaring(size: int) -> bytes:
    """A small zip archive (an Inspect .eval log is one) whose member claims ``size`` (< 4 GiB) bytes unpacked."""
    import io
    import struct
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("header.json", b"{}")
    data = bytearray(buf.getvalue())
    central = data.index(b"PK\x01\x02")
    data[central + 24:central + 28] = struct.pack("<I", size)  # the central directory's uncompressed size
    return bytes(data)


def _r(model: str, fx) -> str:
    return f"replay:{fx['scores']}#{model}"


def _certify(fx, *extra: str, model: str | None = None) -> list[str]:
    return ["certify", "--model", model or _r(MIDDLE, fx), "--goal", "halfwidth:0.1", *extra]


def _pair(cmd: str, fx, *extra: str) -> list[str]:
    return [cmd, "--model", _r(STRONG, fx), "--model", _r(WEAK, fx), *extra]


# (case id, argv builder, a word the one line must contain)
CASES = [
    # plan
    ("plan-eps-zero", lambda fx: ["plan", "--epsilon", "0"], "epsilon"),
    ("plan-eps-negative", lambda fx: ["plan", "--epsilon", "-0.1"], "epsilon"),
    ("plan-eps-nan", lambda fx: ["plan", "--epsilon", "nan"], "epsilon"),
    ("plan-eps-text", lambda fx: ["plan", "--epsilon", "abc"], "epsilon"),
    ("plan-eps-missing", lambda fx: ["plan"], "epsilon"),
    ("plan-confidence-above-1", lambda fx: ["plan", "--epsilon", "0.05", "--confidence", "1.5"], "confidence"),
    ("plan-p-bound-below-half", lambda fx: ["plan", "--epsilon", "0.05", "--p-bound", "0.3"], "p"),
    ("plan-bank-size-zero", lambda fx: ["plan", "--epsilon", "0.05", "--bank-size", "0"], "bank"),
    # bounds
    ("bounds-looks-zero", lambda fx: ["bounds", "--looks", "0"], "looks"),
    ("bounds-looks-huge", lambda fx: ["bounds", "--looks", "1000000"], "looks"),
    ("bounds-alpha-above-1", lambda fx: ["bounds", "--looks", "3", "--alpha", "1.5"], "alpha"),
    ("bounds-alpha-zero", lambda fx: ["bounds", "--looks", "3", "--alpha", "0"], "alpha"),
    ("bounds-spending-unknown", lambda fx: ["bounds", "--looks", "3", "--spending", "nope"], "spending"),
    ("bounds-hsd-gamma-text", lambda fx: ["bounds", "--looks", "3", "--spending", "hsd:abc"], "hsd"),
    ("bounds-sides-3", lambda fx: ["bounds", "--looks", "3", "--sides", "3"], "sides"),
    ("bounds-fractions-decreasing", lambda fx: ["bounds", "--looks", "3", "--fractions", "0.5,0.2,1"], "fractions"),
    ("bounds-fractions-text", lambda fx: ["bounds", "--looks", "3", "--fractions", "a,b"], "fractions"),
    ("bounds-fractions-too-few", lambda fx: ["bounds", "--looks", "3", "--fractions", "0.3,1"], "fractions"),
    ("bounds-fractions-many", lambda fx: ["bounds", "--looks", "2",
                                          "--fractions", ",".join(str((i + 1) / 2000) for i in range(2000))], "looks"),
    ("bounds-beta-above-1", lambda fx: ["bounds", "--looks", "3", "--sides", "1", "--beta", "2"], "beta"),
    # certify
    ("certify-spec-kind", lambda fx: _certify(fx, model="nope:x"), "kind"),
    ("certify-spec-no-colon", lambda fx: _certify(fx, model="justaname"), "spec"),
    ("certify-replay-unknown-model", lambda fx: _certify(fx, model=_r("no_such_model", fx)), "no_such_model"),
    ("certify-replay-missing-file", lambda fx: _certify(fx, model="replay:/nonexistent/s.parquet#m"), "nonexistent"),
    ("certify-replay-no-name", lambda fx: _certify(fx, model=f"replay:{fx['scores']}"), "name"),
    ("certify-replay-bad-option", lambda fx: _certify(fx, model=_r(MIDDLE, fx) + "?bogus=1"), "bogus"),
    ("certify-replay-bad-latency", lambda fx: _certify(fx, model=_r(MIDDLE, fx) + "?latency=-1"), "latency"),
    ("certify-replay-uncovered-bank", lambda fx: _certify(fx, "--bank", fx["wider_bank"]), "never-scored-item"),
    ("certify-goal-zero", lambda fx: ["certify", "--model", _r(MIDDLE, fx), "--goal", "halfwidth:0"], "half-width"),
    ("certify-goal-garbage", lambda fx: ["certify", "--model", _r(MIDDLE, fx), "--goal", "whatever"], "goal"),
    ("certify-goal-above-1", lambda fx: ["certify", "--model", _r(MIDDLE, fx), "--goal", "above:1.5"], "above"),
    ("certify-method-unknown", lambda fx: _certify(fx, "--method", "nope"), "nope"),
    ("certify-method-faq", lambda fx: _certify(fx, "--method", "faq"), "faq"),
    ("certify-history-method-alone", lambda fx: _certify(fx, "--method", "history"), "history"),
    ("certify-history-missing", lambda fx: _certify(fx, "--history", "/nonexistent/h.parquet"), "nonexistent"),
    ("certify-history-wrong-method", lambda fx: _certify(fx, "--history", fx["scores"], "--method", "uniform"),
     "history"),
    ("certify-confidence-zero", lambda fx: _certify(fx, "--confidence", "0"), "confidence"),
    ("certify-batch-zero", lambda fx: _certify(fx, "--batch-size", "0"), "batch-size"),
    ("certify-max-items-negative", lambda fx: _certify(fx, "--max-items", "-1"), "max-items"),
    ("certify-seed-negative", lambda fx: _certify(fx, "--seed", "-1"), "seed"),
    ("certify-run-id-path", lambda fx: _certify(fx, "--run-id", "../escape"), "run-id"),
    ("certify-output-is-file", lambda fx: _certify(fx, "--output", fx["file"]), "output"),
    ("certify-bank-missing", lambda fx: _certify(fx, "--bank", "/nonexistent/bank.parquet"), "nonexistent"),
    ("certify-bank-not-parquet", lambda fx: _certify(fx, "--bank", fx["not_parquet"]), "not.parquet"),
    ("certify-num-gpus-no-gpu", lambda fx: _certify(fx, "--num-gpus", "1"), "GPU"),
    ("certify-num-gpus-negative", lambda fx: _certify(fx, "--num-gpus", "-1"), "num-gpus"),
    ("certify-num-cpus-zero", lambda fx: _certify(fx, "--num-cpus", "0"), "num-cpus"),
    ("certify-replicas-zero", lambda fx: _certify(fx, "--replicas", "0"), "replicas"),
    ("certify-in-flight-zero", lambda fx: _certify(fx, "--in-flight", "0"), "in-flight"),
    ("certify-ray-address-closed", lambda fx: _certify(fx, "--ray-address", fx["closed"]), "ray-address"),
    ("certify-ray-address-garbage", lambda fx: _certify(fx, "--ray-address", "not-an-address"), "ray-address"),
    ("certify-hf-missing-dir", lambda fx: _certify(fx, model="hf:/nonexistent/model"), "nonexistent"),
    ("certify-vllm-without-vllm", lambda fx: _certify(fx, model="vllm:/nonexistent/model"), "vllm"),
    ("certify-openai-not-http", lambda fx: _certify(fx, model="openai:ftp://host/v1#m"), "http"),
    ("certify-openai-unreachable", lambda fx: _certify(fx, "--bank", fx["wider_bank"],
                                                       model=f"openai:{fx['closed_url']}#m"), "127.0.0.1"),
    ("certify-openai-bad-option", lambda fx: _certify(fx, "--bank", fx["wider_bank"],
                                                      model=f"openai:{fx['closed_url']}#m?bogus=1"), "bogus"),
    ("certify-same-model-twice", lambda fx: ["certify", "--model", _r(MIDDLE, fx), "--model", _r(MIDDLE, fx),
                                             "--goal", "halfwidth:0.1"], "twice"),
    ("certify-bank-required", lambda fx: _certify(fx, model="hf:bundled:smollm2"), "bank"),
    # compare
    ("compare-one-model", lambda fx: ["compare", "--model", _r(STRONG, fx)], "compare"),
    ("compare-three-models", lambda fx: _pair("compare", fx, "--model", _r(MIDDLE, fx)), "compare"),
    ("compare-margin-above-1", lambda fx: _pair("compare", fx, "--margin", "2"), "margin"),
    ("compare-margin-negative", lambda fx: _pair("compare", fx, "--margin", "-0.1"), "margin"),
    ("rank-margin-1-distribution", lambda fx: _pair("rank", fx, "--margin", "1", "--target", "distribution"),
     "margin"),  # passed the plan and failed only after config.json was written and Ray/Prefect had started
    ("rank-margin-1-bank", lambda fx: _pair("rank", fx, "--margin", "1"), "margin"),
    ("rank-epsilon-above-1", lambda fx: _pair("rank", fx, "--epsilon", "1.5"), "epsilon"),
    ("rank-history-auto", lambda fx: _pair("rank", fx, "--history", "auto"), "auto"),
    ("select-history-auto-distribution", lambda fx: _pair("select", fx, "--history", "auto", "--target",
                                                          "distribution", "--threshold", "0.3"), "auto"),
    ("select-dry-run-history-auto", lambda fx: _pair("select", fx, "--history", "auto", "--dry-run"), "auto"),
    ("rank-epsilon-zero", lambda fx: _pair("rank", fx, "--epsilon", "0"), "epsilon"),
    ("rank-epsilon-with-margin", lambda fx: _pair("rank", fx, "--epsilon", "0.05", "--margin", "0.02"), "epsilon"),
    ("rank-epsilon-distribution", lambda fx: _pair("rank", fx, "--epsilon", "0.05", "--target", "distribution"),
     "epsilon"),
    ("rank-epsilon-nan", lambda fx: _pair("rank", fx, "--epsilon", "nan"), "epsilon"),
    ("rank-goal-above", lambda fx: _pair("rank", fx, "--goal", "above:0.5"), "halfwidth:E"),
    ("rank-goal-with-margin", lambda fx: _pair("rank", fx, "--goal", "halfwidth:0.1", "--margin", "0.02"), "margin"),
    ("rank-goal-with-epsilon", lambda fx: _pair("rank", fx, "--goal", "halfwidth:0.1", "--epsilon", "0.05"),
     "epsilon"),
    ("compare-method-adaptive", lambda fx: _pair("compare", fx, "--method", "adaptive"), "method"),
    ("compare-history-missing", lambda fx: _pair("compare", fx, "--history", "/nonexistent/h.parquet"), "nonexistent"),
    ("compare-output-is-file", lambda fx: _pair("compare", fx, "--output", fx["file"]), "output"),
    # rank
    ("rank-one-model", lambda fx: ["rank", "--model", _r(STRONG, fx)], "rank"),
    ("rank-history-distribution", lambda fx: _pair("rank", fx, "--history", fx["scores"], "--target", "distribution"),
     "history"),
    ("rank-batch-text", lambda fx: _pair("rank", fx, "--batch-size", "ten"), "batch-size"),
    ("rank-num-gpus-no-gpu", lambda fx: _pair("rank", fx, "--num-gpus", "0.5"), "GPU"),
    # select
    ("select-threshold-missing", lambda fx: _pair("select", fx, "--target", "distribution", "--halfwidth", "0.1"),
     "threshold"),
    ("select-threshold-above-1", lambda fx: _pair("select", fx, "--threshold", "2", "--halfwidth", "0.1"),
     "threshold"),
    ("select-halfwidth-zero", lambda fx: _pair("select", fx, "--target", "distribution", "--threshold", "0.5",
                                                "--halfwidth", "0"), "halfwidth"),
    ("select-mode-unknown", lambda fx: _pair("select", fx, "--threshold", "0.5", "--halfwidth", "0.1",
                                             "--mode", "worst"), "mode"),
    # backtest
    ("backtest-scores-missing", lambda fx: ["backtest", "--scores", "/nonexistent/s.parquet"], "nonexistent"),
    ("backtest-scores-bundled-unknown", lambda fx: ["backtest", "--scores", "bundled:nope"], "nope"),
    ("backtest-scores-not-parquet", lambda fx: ["backtest", "--scores", fx["not_parquet"]], "not.parquet"),
    ("backtest-reps-zero", lambda fx: ["backtest", "--scores", fx["scores"], "--reps", "0"], "reps"),
    ("backtest-goal-garbage", lambda fx: ["backtest", "--scores", fx["scores"], "--goal", "whatever"], "goal"),
    ("backtest-method-unknown", lambda fx: ["backtest", "--scores", fx["scores"], "--method", "nope"], "nope"),
    ("backtest-confidence-above-1", lambda fx: ["backtest", "--scores", fx["scores"], "--confidence", "2"],
     "confidence"),
    ("backtest-model-unknown", lambda fx: ["backtest", "--scores", fx["scores"], "--model", "nope"], "nope"),
    ("backtest-target-unknown", lambda fx: ["backtest", "--scores", fx["scores"], "--target", "moon"], "target"),
    ("backtest-history-junk-round", lambda fx: ["backtest", "--scores", fx["scores"], "--history",
                                                fx["junk_round_run"]], "damaged"),  # was exit 3, a traceback
    ("backtest-history-round-without-scores", lambda fx: ["backtest", "--scores", fx["scores"], "--history",
                                                          fx["scoreless_round_run"]], "'score'"),
    ("certify-history-junk-round", lambda fx: _certify(fx, "--history", fx["junk_round_run"]), "damaged"),
    ("backtest-history-edited-round", lambda fx: ["backtest", "--scores", fx["scores"], "--history",
                                                  fx["edited_round_run"]], "differs from what was written"),
    ("backtest-history-stray-round", lambda fx: ["backtest", "--scores", fx["scores"], "--history",
                                                 fx["stray_round_run"]], "not in manifest.json"),
    ("backtest-batch-size-zero-compare", lambda fx: ["backtest", "compare", "--scores", fx["scores"], "--batch-size",
                                                     "0"], "batch-size"),  # a look of 0 items would never end
    ("backtest-pairs-zero-compare", lambda fx: ["backtest", "compare", "--scores", fx["scores"], "--pairs", "0"],
     "--pairs"),
    ("backtest-goal-compare-gone", lambda fx: ["backtest", "--scores", fx["scores"], "--goal", "compare:0"],
     "certeval backtest compare"),
    # report
    ("report-missing-folder", lambda fx: ["report", "/nonexistent/run"], "nonexistent"),
    ("report-empty-folder", lambda fx: ["report", fx["empty"]], "results.json"),
    ("report-a-file", lambda fx: ["report", fx["file"]], "a-file"),
    ("report-truncated-results", lambda fx: ["report", fx["damaged_run"]], "results.json"),
    ("report-results-a-list", lambda fx: ["report", fx["list_run"]], "results.json"),
    ("report-results-empty-object", lambda fx: ["report", fx["empty_run"]], "results.json"),
    ("report-savings-missing", lambda fx: ["report", fx["damaged_run"], "--savings", "/nonexistent/s.json"],
     "results.json"),
    # rescore
    ("rescore-missing-folder", lambda fx: ["rescore", "/nonexistent/run", "--scorer", "exact"], "no run at"),
    ("rescore-a-file", lambda fx: ["rescore", fx["file"], "--scorer", "exact"], "a-file"),
    ("rescore-no-config", lambda fx: ["rescore", fx["damaged_run"], "--scorer", "exact"], "config.json"),
    ("rescore-no-scorer", lambda fx: ["rescore", fx["empty"]], "scorer"),
    # demo
    ("demo-lm-items-zero", lambda fx: ["demo", "--lm-items", "0"], "lm-items"),
    ("demo-ray-address-closed", lambda fx: ["demo", "--skip-lm", "--ray-address", fx["closed"]], "ray-address"),
    ("demo-output-is-file", lambda fx: ["demo", "--skip-lm", "--output", fx["file"]], "output"),
    ("demo-seed-negative", lambda fx: ["demo", "--skip-lm", "--seed", "-1"], "seed"),
    ("certify-latency-nan", lambda fx: _certify(fx, model=_r(MIDDLE, fx) + "?latency=nan"), "finite"),
    ("certify-latency-inf", lambda fx: _certify(fx, model=_r(MIDDLE, fx) + "?latency=inf"), "finite"),
    ("certify-openai-timeout-nan", lambda fx: _certify(fx, "--bank", fx["wider_bank"],
                                                       model="openai:http://127.0.0.1:9/v1#m?timeout=nan"), "timeout"),
    # import: an output never replaces an input or the other output
    ("import-output-is-the-input", lambda fx: ["import", "lm-eval", fx["samples"], "-o", fx["samples"]],
     "being read"),  # replaced the user's samples file with the scores, exit 0
    ("import-output-links-to-the-input", lambda fx: ["import", "lm-eval", fx["samples"], "-o", fx["samples_link"]],
     "being read"),
    ("import-items-is-the-input", lambda fx: ["import", "lm-eval", fx["samples"], "-o", "s.parquet", "--items",
                                             fx["samples"]], "being read"),
    ("import-items-same-as-output", lambda fx: ["import", "lm-eval", fx["samples"], "-o", "s.parquet", "--items",
                                               "./s.parquet"], "same file"),
    ("import-output-under-a-file", lambda fx: ["import", "lm-eval", fx["samples"], "-o",
                                              fx["file"] + "/s.parquet"], "a file"),
    ("import-output-a-folder", lambda fx: ["import", "lm-eval", fx["samples"], "-o", fx["folder_parquet"]],
     "is a folder"),
    ("import-eval-declaring-4-GB", lambda fx: ["import", "inspect", fx["huge_eval"], "-o", "s.parquet"],
     "declare"),  # refused after ~22 s and 0.7-2.3 GB before: now from the declared sizes, before unpacking
    ("import-samples-not-utf8", lambda fx: ["import", "lm-eval", fx["latin_samples"], "-o", "s.parquet"], "UTF-8"),
    ("import-samples-a-folder", lambda fx: ["import", "lm-eval", fx["folder_samples"], "-o", "s.parquet"],
     "a folder"),  # both were exit 3 with a traceback
    ("select-checkpoints-match-nothing", lambda fx: ["select", "--checkpoints", "/nonexistent/ckpt-*"], "names no"),
    ("select-checkpoint-not-a-model", lambda fx: ["select", "--checkpoints", fx["empty"]], "config.json"),
    ("select-without-models", lambda fx: ["select"], "--checkpoints"),
    # no subcommand / unknown subcommand
    ("no-command", lambda fx: [], "command"),
    ("unknown-command", lambda fx: ["frobnicate"], "frobnicate"),
]

_HAS_OUTPUT = ("certify", "compare", "rank", "select", "demo")


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize("case_id,build,word", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case_id, build, word, fixtures, tmp_path, monkeypatch,
                                                            capsys):
    monkeypatch.chdir(tmp_path)
    argv = build(fixtures)
    out = tmp_path / "out"
    if argv and argv[0] in _HAS_OUTPUT and "--output" not in argv:
        argv = [*argv, "--output", str(out)]
    before = _snapshot(Path(fixtures["scores"]).parent)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (case_id, code, err)
    assert len(lines) == 1, (case_id, err)
    assert word.lower() in lines[0].lower(), (case_id, lines[0])
    assert "Traceback" not in err
    assert not out.exists(), f"{case_id}: {out} was written"
    assert list(tmp_path.iterdir()) == [], f"{case_id}: left {sorted(_snapshot(tmp_path))}"
    assert _snapshot(Path(fixtures["scores"]).parent) == before, f"{case_id}: the fixtures changed"


def test_the_table_spans_every_subcommand_with_at_least_60_cases():
    commands = {c[0].split("-")[0] for c in CASES}
    assert len(CASES) >= 60
    assert {"plan", "bounds", "certify", "compare", "rank", "select", "backtest", "report", "demo"} <= commands


@pytest.mark.parametrize("argv", [
    ["certify", "--model", "replay:bundled:helm_mmlu#no_such_model", "--goal", "halfwidth:0.1"],
    ["rank", "--model", "replay:bundled:helm_mmlu#openai_ada", "--model", "replay:bundled:helm_mmlu#openai_davinci",
     "--num-gpus", "1"],
    ["bounds", "--looks", "5000"],
], ids=["certify-unknown-model", "rank-gpu", "bounds-huge"])
def test_real_cli_without_prefect_setup_leaves_no_prefect_folder(argv, tmp_path):
    """The real entry point, no Prefect configuration: ./.prefect and ./certeval-runs must stay absent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "certeval", *argv], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert list(work.iterdir()) == []
    assert not (tmp_path / "home" / ".prefect").exists()


@pytest.mark.parametrize("argv", [
    ["certify", "--model", "openai", "--model_args", "base_url=http://127.0.0.1:9/v1,api_key=SECRET-v4lue-123"],
    ["certify", "--model", "openai:http://127.0.0.1:9/v1#m?api_key=SECRET-v4lue-123&temperature=0"],
    ["certify", "--model", "hf:bundled:smollm2", "--model_args", "hf_token=SECRET-v4lue-123,oops"],
])
def test_a_refusal_never_echoes_an_inline_secret(argv, fixtures, tmp_path, monkeypatch, capsys):
    """Bad input that carries a key inline is refused in one line that names the problem but not the key."""
    monkeypatch.chdir(tmp_path)
    code = main([*argv, "--bank", fixtures["wider_bank"], "--goal", "halfwidth:0.1", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "SECRET-v4lue-123" not in err and "=***" in err, err
    assert list(tmp_path.iterdir()) == []


def _read_only_runner(folder: Path) -> list[str] | None:
    """A prefix that runs a command with ``folder`` read-only for it: a read-only tmpfs mounted over it in a
    private mount namespace (root; permissions do not stop root), or the folder's own mode (anyone else)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro none {folder}"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o ro none {folder} && exec "$@"', "sh"]


@pytest.mark.parametrize("kind", ["certify", "import"])
def test_an_output_in_a_read_only_folder_is_refused_before_anything_runs(kind, fixtures, tmp_path):
    """A real read-only folder: exit 2, one line naming the option and the folder, no traceback (it was exit 3)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    prefix = _read_only_runner(ro)
    if prefix is None:
        pytest.skip("no read-only folder can be made here: root without a private mount namespace")
    argv = (["certify", "--model", _r(MIDDLE, fixtures), "--goal", "halfwidth:0.1", "--output", str(ro / "runs")]
            if kind == "certify" else ["import", "lm-eval", fixtures["samples"], "-o", str(ro / "s.parquet")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "certeval", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        ro.chmod(0o755)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "not writable" in lines[0] and str(ro) in lines[0], lines[0]
    assert list(ro.iterdir()) == [] and not (tmp_path / ".prefect").exists()
