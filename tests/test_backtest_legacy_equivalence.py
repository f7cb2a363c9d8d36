"""The port of ``certeval backtest --goal compare:D | rank:D | select:T,E`` (issue 57): for each legacy spelling the
benchmarks and docs use, ``certeval backtest COMMAND`` with the new flags plays the same request on the same
matrix and returns the same numbers. The one rule that differs by design is which order a rep draws: the new form's
rep r is the live run with --seed (seed + r), the legacy one's was keyed by (seed, dataset, models, kind, rep); the
legacy path is played here with the live order (with a history share both draw the legacy way). Cost: ~40 s."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pytest

from certeval.backtests import comparative
from certeval.cli import main


def _json(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue())


def _comparable(out):
    out = {k: v for k, v in out.items() if k not in ("config", "answer")}
    # the exact bank means are summed in another order (the last digit differs): equal means may list either way
    out["summary"] = {k: v for k, v in out["summary"].items() if k not in ("wall_s_per_rep", "full_bank_order")}
    return out


CASES = [  # (legacy flags, the new form's flags)
    (["--scores", "bundled:helm_mmlu", "--goal", "rank:0", "--epsilon", "0.1", "--reps", "1", "--looks-every", "50"],
     ["rank", "--scores", "bundled:helm_mmlu", "--epsilon", "0.1", "--reps", "1", "--batch-size", "50"]),
    (["--scores", "bundled:helm_raft", "--goal", "rank:0.02", "--reps", "2"],
     ["rank", "--scores", "bundled:helm_raft", "--margin", "0.02", "--reps", "2", "--batch-size", "100"]),
    (["--scores", "bundled:helm_raft", "--goal", "rank:0", "--epsilon", "0.1", "--ranking", "all-pairs", "--reps",
      "1", "--looks-every", "50"],
     ["rank", "--scores", "bundled:helm_raft", "--epsilon", "0.1", "--ranking", "all-pairs", "--reps", "1",
      "--batch-size", "50"]),
    (["--scores", "bundled:helm_raft", "--goal", "rank:0", "--epsilon", "0.1", "--history-fraction", "0.5",
      "--looks-every", "10", "--reps", "2"],
     ["rank", "--scores", "bundled:helm_raft", "--epsilon", "0.1", "--history-fraction", "0.5", "--batch-size", "10",
      "--reps", "2"]),
    (["--scores", "bundled:helm_raft", "--goal", "select:0,0.02", "--history-fraction", "0.5", "--looks-every", "10",
      "--reps", "2"],
     ["select", "--scores", "bundled:helm_raft", "--threshold", "0", "--halfwidth", "0.02", "--history-fraction",
      "0.5", "--batch-size", "10", "--reps", "2"]),
    (["--scores", "bundled:helm_raft", "--goal", "select:0.6,0.05", "--reps", "1"],
     ["select", "--scores", "bundled:helm_raft", "--threshold", "0.6", "--halfwidth", "0.05", "--reps", "1",
      "--batch-size", "100"]),
    (["--scores", "bundled:vlm_ocrbench", "--goal", "compare:0", "--reps", "2", "--pairs", "15"],
     ["compare", "--scores", "bundled:vlm_ocrbench", "--pairs", "15", "--reps", "2", "--batch-size", "100"]),
    (["--scores", "bundled:helm_raft", "--goal", "compare:0.01", "--target", "distribution", "--statistic",
      "unpaired", "--spending", "hsd:-4", "--reps", "2", "--pairs", "5", "--confidence", "0.9"],
     ["compare", "--scores", "bundled:helm_raft", "--margin", "0.01", "--target", "distribution", "--statistic",
      "unpaired", "--spending", "hsd:-4", "--reps", "2", "--pairs", "5", "--confidence", "0.9",
      "--batch-size", "100"]),
    (["--scores", "bundled:helm_raft", "--goal", "select:0.3,0.05", "--target", "distribution", "--reps", "1",
      "--model", "openai_ada", "--model", "openai_davinci", "--model", "writer_palmyra-x"],
     ["select", "--scores", "bundled:helm_raft", "--threshold", "0.3", "--halfwidth", "0.05", "--target",
      "distribution", "--reps", "1", "--batch-size", "100", "--model", "openai_ada", "--model", "openai_davinci",
      "--model", "writer_palmyra-x"]),
]


@pytest.mark.parametrize("legacy, new", CASES, ids=[" ".join(new[:1] + new[3:6]) for _, new in CASES])
def test_the_new_form_plays_the_legacy_spelling(legacy, new, monkeypatch):
    real = comparative.ComparativeBacktest

    def live_order(*args, **kwargs):
        bt = real(*args, **kwargs)
        return replace(bt, live_order=bt.history_fraction is None)

    with monkeypatch.context() as mp:
        mp.setattr(comparative, "ComparativeBacktest", live_order)
        old = _json(["backtest", *legacy, "--json"])
    played = _json(["backtest", *new, "--json"])
    _assert_close(_comparable(played), _comparable(old))


def _assert_close(a, b, where="out"):
    """Equal, floats to 1e-9 (the exact bank differences are summed in another order)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{k}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where
