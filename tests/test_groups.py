"""The paired runs' group estimators behind one protocol (certeval.estimators.groups), driven by the engine's
PairedRounds with scores looked up in a matrix: every kind and target speaks the protocol, and what they decide
is what the underlying estimator computes when fed directly."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.engine import PairedRounds
from certeval.estimators.distribution.comparison import ComparisonDesign, PairedComparison
from certeval.estimators.groups import GroupEstimator, GroupRequest, make_group
from certeval.estimators.protocol import BankSpec


def _bank(seed: int, m: int = 3, n: int = 240):
    rng = np.random.default_rng(seed)
    codes = np.repeat(np.arange(3), [40, 80, n - 120])
    p = np.clip(rng.uniform(0.2, 0.8, (m, 1)) + 0.2 * (codes == 1), 0, 1)
    scores = (rng.random((m, n)) < p).astype(float)
    return BankSpec(n_items=n, subsets=codes, subset_names=("a", "b", "c")), scores


def _play(rounds: PairedRounds, scores: np.ndarray) -> PairedRounds:
    row = {label: i for i, label in enumerate(rounds.request.labels)}
    while not rounds.done:
        items, _ = rounds.select()
        if not len(items):
            break
        rounds.update(items, {label: scores[row[label], items] for label in rounds.active})
        rounds.decide()
    return rounds


@pytest.mark.parametrize("kind", ["compare", "rank", "select"])
@pytest.mark.parametrize("target", ["bank", "distribution"])
def test_every_group_speaks_the_protocol_and_decides_every_model(kind, target):
    spec, scores = _bank(1, m=2 if kind == "compare" else 3)
    labels = tuple(f"m{i}" for i in range(len(scores)))
    request = GroupRequest(kind=kind, labels=labels, target=target, margin=0.02, threshold=0.3, halfwidth=0.1,
                           look_size=30)
    rounds = PairedRounds(request, n_items=spec.n_items, batch_size=30).start(spec, np.random.default_rng(3))
    assert isinstance(rounds.group, GroupEstimator) and type(rounds.group) is type(make_group(request))
    _play(rounds, scores)
    assert rounds.done and set(rounds.decisions) == set(labels) and all(d.done for d in rounds.decisions.values())
    assert rounds.looks == sorted(rounds.looks) and rounds.n_shared <= spec.n_items
    # values: the models' bank means are far apart (0.56 / 0.87 / 0.33), so every kind and target finds the truth
    decisions, truth = rounds.decisions, spec.weights() @ scores.T
    best = labels[int(np.argmax(truth))]
    if kind == "compare":
        assert rounds.outcome.verdict == "b>a" and {d.verdict for d in decisions.values()} == {"b>a"}
        assert rounds.outcome.upper < -request.margin  # the interval of a - b lies below -margin: b beats a
    elif kind == "rank":
        assert rounds.outcome.tie_groups == tuple((labels[k],) for k in np.argsort(-truth))
        assert decisions[best].verdict == "rank 1"
    else:
        assert [m for m, d in decisions.items() if d.verdict in ("selected", "candidate")] == [best]
    assert all(d.rule == kind and 1 <= d.look <= len(rounds.looks) for d in decisions.values())
    for label, (mean, lower, upper, items) in rounds.intervals.items():
        assert lower <= mean <= upper and items in rounds.looks
        if target == "bank":  # exact CSs for the bank means
            assert lower <= truth[labels.index(label)] <= upper


@pytest.mark.parametrize("seed", range(5))
def test_distribution_compare_reads_each_items_own_sub_dataset(seed):
    """The pair's mean-of-means difference is the one PairedComparison computes over the scored items with
    their own sub-dataset codes (the shared order's codes were once read at bank positions: a scrambled
    estimand on every bank with sub-datasets)."""
    spec, scores = _bank(seed, m=2)
    request = GroupRequest(kind="compare", labels=("a", "b"), target="distribution", margin=0.0, look_size=60)
    rounds = PairedRounds(request, n_items=spec.n_items, batch_size=60, max_items=120)
    _play(rounds.start(spec, np.random.default_rng(seed)), scores)
    items = rounds.order[:rounds.n_shared]
    direct = PairedComparison("a", "b", design=ComparisonDesign(alpha=0.05, margin=0.0, look_size=60))
    direct.start(spec.n_items, spec.subset_codes())
    for start in range(0, len(items), 60):
        chunk = items[start:start + 60]
        direct.update(chunk, scores[0, chunk], scores[1, chunk])
    want = direct.result()
    assert rounds.outcome.diff == pytest.approx(want.diff, abs=1e-12)
    assert (rounds.outcome.lower, rounds.outcome.upper) == pytest.approx((want.lower, want.upper), abs=1e-12)
