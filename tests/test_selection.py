"""Selection: discards below a threshold are correct with probability >= 1 - alpha; best-model identification."""

from __future__ import annotations

import math

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.selection import SelectionRule, select_models


def _scores(acc, n, rng):
    return (rng.random((len(acc), n)) < np.asarray(acc)[:, None]).astype(float)


def test_no_wrong_discards_beyond_alpha_and_savings():
    acc = [0.55, 0.58, 0.6, 0.6, 0.65, 0.75, 0.45, 0.3]
    names = [f"m{k}" for k in range(len(acc))]
    rng = np.random.default_rng(5)
    wrong, used, reps = 0, [], 200
    for _ in range(reps):
        s = _scores(acc, 1000, rng)
        bank_means = s.mean(axis=1)
        sel = select_models(s, names, list(range(100, 1001, 100)), SelectionRule(0.6, 0.03))
        wrong += any(m.status == "below" and bank_means[names.index(m.model)] >= 0.6 for m in sel.models)
        used.append(sel.fraction_used)
    assert wrong / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert np.mean(used) < 0.9
    assert "m7" in sel.discarded and "m5" in sel.selected


def test_best_model_identification():
    rng = np.random.default_rng(1)
    s = _scores([0.9, 0.6, 0.55, 0.5], 3000, rng)
    sel = select_models(s, list("abcd"), list(range(100, 3001, 100)), SelectionRule(0.0, 0.01, mode="best"))
    assert sel.selected == ("a",)
    assert {m.status for m in sel.models if m.model != "a"} == {"not-best"}
    assert sel.fraction_used < 0.2 and "Bonferroni" in sel.guarantee
    assert sel.to_dict()["mode"] == "best"


@pytest.mark.parametrize("kwargs,match", [
    (dict(threshold=1.5, halfwidth=0.02), "threshold"),
    (dict(threshold=0.5, halfwidth=0.0), "halfwidth"),
    (dict(threshold=0.5, halfwidth=0.02, mode="worst"), "mode"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(InputError, match=match):
        select_models(np.zeros((2, 10)), ["a", "b"], [10], SelectionRule(**kwargs))
