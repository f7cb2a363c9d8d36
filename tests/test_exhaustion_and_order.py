"""Two promises of the round protocol, for every single-model method (issue: statistics under misuse or
bad luck): at exhaustion the interval is the exact bank mean even after the sequence missed, and the
scores of one batch give the same result whatever order they arrive in."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.estimators import BankSpec, make_method
from certeval.estimators.history.prior import fit_history_prior

METHODS = ["uniform", "adaptive", "seq", "cer-eval", "static", "history"]


def _spec(n: int, rng: np.random.Generator, x: np.ndarray) -> BankSpec:
    hist = np.clip(x[None, :] * 0.6 + rng.random((4, n)) * 0.4, 0, 1)
    return BankSpec(n, subsets=np.arange(n) % 2, subset_names=("a", "b"), features=rng.normal(size=(n, 2)),
                    history=fit_history_prior(hist))


@pytest.mark.parametrize("name", METHODS)
def test_batch_arrival_order_does_not_change_the_result(name):
    rng = np.random.default_rng(1)
    x = (rng.random(120) < 0.4).astype(float)
    spec = _spec(120, rng, x)
    results = []
    for shuffle in (False, True):
        method = make_method(name, confidence=0.9).start(spec)
        r = np.random.default_rng(5)
        arrival = np.random.default_rng(8)
        for _ in range(4):
            prop = method.propose(15, r)
            order = arrival.permutation(len(prop)) if shuffle else np.arange(len(prop))
            method.update(prop.items[order], x[prop.items[order]])
        results.append(method.result())
    assert results[0] == results[1]


def test_uniform_reports_the_exact_mean_at_exhaustion_after_a_miss():
    rng = np.random.default_rng(2)
    x = (rng.random(80) < 0.5).astype(float)
    method = make_method("uniform", confidence=0.9).start(BankSpec(80))
    prop = method.propose(40, rng)
    method.update(prop.items, x[prop.items])
    cs = method.cs_[0]
    truth = x.mean()
    cs.running = (truth + 0.2, min(truth + 0.3, 1.0))  # the rare miss: the sequence has excluded the truth
    while not method.exhausted:
        prop = method.propose(10, rng)
        method.update(prop.items, x[prop.items])
    est = method.result()
    assert est.lower == pytest.approx(truth) and est.upper == pytest.approx(truth)
    assert est.mean == pytest.approx(truth)
