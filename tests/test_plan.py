"""``certeval plan`` and the planner (Hayou's sample-size note)."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import norm

from certeval.cli import main
from certeval.errors import InputError
from certeval.estimators.planning import anytime_sample_size, plan_sample_size
from certeval.estimators.single.bounds import seq_radius


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_blog_numbers(capsys):
    out = _json(capsys, ["plan", "--epsilon", "0.02", "--confidence", "0.95", "--json"])
    assert out["n_worst_case"] == 2401  # Hayou's rule: 1.96²/(4·0.02²) = 2401
    out = _json(capsys, ["plan", "--epsilon", "0.02", "--confidence", "0.95", "--p-bound", "0.8", "--json"])
    assert out["n_p_bound"] == 1537


def test_against_independent_formulae():
    for eps, conf in [(0.05, 0.9), (0.01, 0.99), (0.031, 0.95)]:
        z = norm.isf((1 - conf) / 2)
        plan = plan_sample_size(eps, conf, p_bound=0.7, bank_size=3000)
        assert plan.n_worst_case == math.ceil(z * z / (4 * eps * eps))
        assert plan.n_p_bound == math.ceil(z * z * 0.21 / (eps * eps))
        n0 = plan.n_worst_case
        assert plan.n_without_replacement == min(3000, math.ceil(n0 / (1 + (n0 - 1) / 3000)))
        n_any = anytime_sample_size(eps, 1 - conf)
        assert seq_radius(n_any, 1 - conf) <= eps < seq_radius(n_any - 1, 1 - conf)
        assert plan.n_anytime_valid == min(n_any, 3000)


def test_bank_size_counts(capsys):
    out = _json(capsys, ["plan", "--epsilon", "0.05", "--confidence", "0.95", "--bank-size", "500", "--json"])
    assert out["n_without_replacement"] < out["n_worst_case"] <= 500 or out["n_without_replacement"] <= 500
    assert out["n_anytime_valid"] <= 500


@pytest.mark.parametrize("argv, message", [
    (["--epsilon", "0"], "epsilon"),
    (["--epsilon", "-0.1"], "epsilon"),
    (["--epsilon", "0.02", "--confidence", "1.0"], "confidence"),
    (["--epsilon", "0.02", "--confidence", "0"], "confidence"),
    (["--epsilon", "0.02", "--p-bound", "0.4"], "p-bound"),
    (["--epsilon", "0.02", "--p-bound", "1"], "p-bound"),
    (["--epsilon", "0.02", "--bank-size", "0"], "bank-size"),
])
def test_bad_input_exits_2(capsys, argv, message):
    assert main(["plan", *argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1


def test_planner_validation_is_its_own_error():
    with pytest.raises(InputError):
        plan_sample_size(float("nan"))
