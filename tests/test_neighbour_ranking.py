"""The neighbour ε-ranking (``estimators/bank/neighbour_ranking.py``): per-model CSs at (share·α)/M settle the pairs far
apart, pair tests at ((1 − share)·α)/P — every pair's share fixed before any data — are opened only for the
neighbours the intervals leave unsettled, replayed from the first item.

Checked here: the family-wise error with peeking on hard boards (chains of models ε + 0.002 apart) against a
control without the multiplicity correction; the tie groups against the dense strongly-connected-components
construction of the all-pairs ranking; a state round trip; the backtest path (``--ranking``); the pair table at
scale (only the opened pairs, totals counted over all P).

Power of the family-wise check (``benchmarks/neighbour_fwer.py``'s boards: 3 chains of 5 models, 500 items, a look
every 25 items, α = 0.1): with 40 runs the bound is the 0.999 quantile of Binomial(40, 0.1), 11. The corrected
ranking failed 2 of 300 runs (benchmarks/results/neighbour_fwer.json); the uncorrected control fails 0.43 of the
runs with the per-item betting tests, so it exceeds 11 of 40 with probability 0.97 (0.93 if its true rate were
0.40, 0.79 at 0.35). The whole ≥ 300-run check, both engines: ``python -m benchmarks neighbour_fwer``."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from certeval.estimators.bank.neighbour_ranking import NeighbourRanking
from certeval.estimators.bank.ranking import epsilon_groups
from certeval.estimators.distribution.comparison import A_OVER_B, B_OVER_A, EITHER_ORDER


def _board(seed: int, m: int, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ability = rng.normal(0, 0.6, m)
    difficulty = rng.normal(0, 1, n)
    p = 1 / (1 + np.exp(difficulty[None, :] - ability[:, None]))
    return (rng.random((m, n)) < p).astype(float)


def _ranking(x: np.ndarray, looks: int, look: int = 30, **kw) -> NeighbourRanking:
    m, n = x.shape
    rank = NeighbourRanking([f"m{k:02d}" for k in range(m)], alpha=kw.pop("alpha", 0.2), epsilon=0.05,
                            **kw).start(np.full(n, 1.0 / n))
    for start in range(0, min(looks * look, n), look):
        rank.update(np.arange(start, min(start + look, n)), x[:, start:start + look])
    return rank


@pytest.mark.parametrize("pair_tests", ["betting", "look"])
def test_tie_groups_are_the_strong_components_of_the_required_listings(pair_tests):
    """At any look (undecided pairs included), the sparse construction gives the groups of the dense one on every
    pair's certified listings (the strongly connected components), in an order every certificate allows."""
    checked = 0
    for seed in range(25):
        rng = np.random.default_rng(seed)
        x = _board(seed, int(rng.integers(3, 30)))
        rank = _ranking(x, int(rng.integers(1, 11)), pair_tests=pair_tests)
        checked += rank.pending.any()
        table = rank.pair_table()
        dense = epsilon_groups(rank.model_mean, rank.names, table.a, table.b, table.verdict)
        groups = rank.groups()
        assert sorted(map(sorted, groups)) == sorted(map(sorted, dense)), seed
        # a topological order: every pair in two groups is listed in an order its certificate allows
        place = np.empty(len(rank.names), dtype=int)
        for g, members in enumerate(groups):
            place[members] = g
        a_first, b_first = place[table.a] < place[table.b], place[table.b] < place[table.a]
        assert not (a_first & ~np.isin(table.verdict, (A_OVER_B, EITHER_ORDER))).any(), seed
        assert not (b_first & ~np.isin(table.verdict, (B_OVER_A, EITHER_ORDER))).any(), seed
    assert checked >= 5  # boards with pending models (their undecided pairs never opened) among them


def test_a_state_round_trip_continues_the_same_run():
    x = _board(3, 25, 400)
    first = _ranking(x, 4, look=40)
    again = NeighbourRanking.from_state(first.state())
    for r in (first, again):
        for start in range(160, 400, 40):
            r.update(np.arange(start, start + 40), x[:, start:start + 40])
    a, b = first.result(), again.result()
    assert a.tie_groups == b.tie_groups and a.items_used == b.items_used
    assert np.array_equal(first.rej_a, again.rej_a) and np.array_equal(first.pa, again.pa)


def test_a_large_board_reports_only_the_opened_pairs_with_totals_over_every_pair(monkeypatch):
    from certeval.estimators.bank import neighbour_ranking

    monkeypatch.setattr(neighbour_ranking, "FULL_TABLE_MAX", 10)
    x = _board(5, 30, 300)
    rank = _ranking(x, 10)
    res = rank.result()
    assert len(res.pairs) == rank.n_opened < rank.n_pairs == 435
    summary = res.to_dict(comparisons=False)
    assert summary["n_pairs"] == 435 and summary["n_pairs_decided"] == 435  # exhausted: every pair settled
    assert sum(len(g) for g in res.tie_groups) == 30


def test_family_wise_error_with_peeking_is_within_alpha_and_the_uncorrected_control_is_caught():
    from benchmarks.neighbour_fwer import family_wise

    runs, alpha = 40, 0.1
    bound = stats.binom.ppf(0.999, runs, alpha)
    valid = family_wise(runs, alpha, "bonferroni", "betting")
    broken = family_wise(runs, alpha, "none", "betting")
    assert valid["failures"] <= bound < broken["failures"], (valid, broken)


def test_the_backtest_runs_the_neighbour_ranking_unless_told_otherwise(capsys):
    import json

    from certeval.cli import main

    outs = {}
    for ranking in ("auto", "all-pairs"):
        rc = main(["backtest", "rank", "--scores", "bundled:helm_mmlu", "--epsilon", "0.1", "--reps", "1",
                   "--batch-size", "100", "--ranking", ranking, "--json"])
        assert rc == 0
        outs[ranking] = json.loads(capsys.readouterr().out)
    new, old = outs["auto"]["summary"], outs["all-pairs"]["summary"]
    assert new["construction"] == "neighbours" and old["construction"] == "all-pairs"
    assert "whether or not a pair is ever opened" in new["guarantee"] and new["family_wise_error_rate"] == 0
    assert new["fraction_used"] <= 1.05 * old["fraction_used"]


def test_the_scale_benchmark_child_ranks_a_small_synthetic_board():
    from benchmarks.scale import epsilon_rank_child

    rec = epsilon_rank_child("synthetic:60x600:7", 100, 0)
    assert rec["wrong_listings"] == 0 and rec["n_models"] == 60 and 0 < rec["cells"] <= 1
    assert rec["pairs_opened"] <= rec["pairs_total"] == 1770 and rec["peak_rss_gb"] > 0
