"""Group-sequential boundaries: published tables, an independent MVN (Genz) check, Monte Carlo type-I error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from certeval.cli import main
from certeval.errors import InputError
from certeval.estimators.distribution.boundaries import (
    crossing_probabilities,
    group_sequential_boundary,
    spending_function,
)

# Pocock (1977); Jennison & Turnbull (2000) Table 2.1: two-sided alpha = 0.05.
POCOCK_05 = {1: 1.960, 2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413, 6: 2.453}
# Jennison & Turnbull (2000) Table 2.1, alpha = 0.01 two-sided.
POCOCK_01 = {2: 2.772, 3: 2.873, 4: 2.939, 5: 2.986}
# O'Brien & Fleming constants C (two-sided 0.05), J&T Table 2.3: boundary C sqrt(K/k).
OBF_05 = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}


def _brownian_z(fractions, n_paths, rng):
    """Z_k = S(t_k)/sqrt(t_k) for Brownian motion S, n_paths x K (vectorised)."""
    t = np.asarray(fractions)
    inc = rng.standard_normal((n_paths, len(t))) * np.sqrt(np.diff(np.concatenate([[0.0], t])))
    return np.cumsum(inc, axis=1) / np.sqrt(t)


def _mvn_no_crossing(bounds, fractions, sides):
    """P(no crossing through each look) by scipy's multivariate normal CDF (Genz), Corr = sqrt(t_i/t_j)."""
    t = np.asarray(fractions)
    out = []
    for k in range(1, len(t) + 1):
        tk = t[:k]
        cov = np.sqrt(np.minimum.outer(tk, tk) / np.maximum.outer(tk, tk))
        upper = np.asarray(bounds[:k])
        lower = -upper if sides == 2 else np.full(k, -np.inf)
        out.append(stats.multivariate_normal.cdf(upper, np.zeros(k), cov, lower_limit=lower, abseps=1e-7,
                                                 releps=1e-7, maxpts=200000 * k, rng=np.random.default_rng(1)))
    return np.asarray(out)


@pytest.mark.parametrize("looks", sorted(POCOCK_05))
def test_pocock_matches_published_table(looks):
    b = group_sequential_boundary(looks, 0.05, "pocock")
    assert np.allclose(b.boundaries, POCOCK_05[looks], atol=1e-3)
    assert b.cumulative[-1] == pytest.approx(0.05, abs=1e-9)


@pytest.mark.parametrize("looks", sorted(POCOCK_01))
def test_pocock_other_alpha(looks):
    b = group_sequential_boundary(looks, 0.01, "pocock")
    assert np.allclose(b.boundaries, POCOCK_01[looks], atol=1.5e-3)


@pytest.mark.parametrize("looks", sorted(OBF_05))
def test_obrien_fleming_matches_published_constants(looks):
    b = group_sequential_boundary(looks, 0.05, "obrien-fleming")
    expected = [OBF_05[looks] * math.sqrt(looks / k) for k in range(1, looks + 1)]
    assert np.allclose(b.boundaries, expected, atol=2e-3)


def test_obf_k5_issue_values():
    b = group_sequential_boundary(5, 0.05, "obrien-fleming")
    assert np.allclose(b.boundaries, [4.562, 3.226, 2.634, 2.281, 2.040], atol=1e-3)


def test_one_sided_equals_two_sided_at_double_alpha_for_large_boundaries():
    # one-sided 0.025 Pocock: the lower tail of the two-sided 0.05 design is negligible after look 1,
    # so the constants agree closely (J&T Table 2.1 is usually quoted both ways).
    one = group_sequential_boundary(5, 0.025, "pocock", sides=1)
    two = group_sequential_boundary(5, 0.05, "pocock", sides=2)
    assert one.boundaries[0] == pytest.approx(two.boundaries[0], abs=2e-3)
    # K = 1: plain normal quantiles
    assert group_sequential_boundary(1, 0.05, "ld-obf", sides=1).boundaries[0] == pytest.approx(1.6449, abs=1e-4)
    assert group_sequential_boundary(1, 0.01, "hsd:-4").boundaries[0] == pytest.approx(2.5758, abs=1e-4)


def test_hsd_minus4_matches_gsdesign_default_upper_bounds():
    # gsDesign::gsDesign() defaults (k=5, one-sided 0.025, sfHSD gamma=-4): 3.25 2.99 2.69 2.37 2.03
    b = group_sequential_boundary(5, 0.025, "hsd:-4", sides=1)
    assert np.allclose(b.boundaries, [3.25, 2.99, 2.69, 2.37, 2.03], atol=6e-3)


def test_ld_obf_two_sided_matches_gsdesign_symmetric_design():
    # gsDesign(k=5, test.type=2, alpha=0.025, sfu=sfLDOF) (rpact asOF, two-sided 0.05): 4.8769 3.3569 2.6803
    # 2.2898 2.0310 — alpha/2 spent per side with the one-sided Lan-DeMets O'Brien-Fleming function
    b = group_sequential_boundary(5, 0.05, "ld-obf", fractions=(0.2, 0.4, 0.6, 0.8, 1.0), sides=2)
    assert np.allclose(b.boundaries, [4.8769, 3.3569, 2.6803, 2.2898, 2.0310], atol=1e-3)
    # the 1983 two-sided form, kept under its own name, spends 2 - 2 Phi(z_{alpha/2}/sqrt(t)) in total
    old = group_sequential_boundary(5, 0.05, "ld-obf-1983", sides=2)
    t = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
    assert np.allclose(old.cumulative, 2 - 2 * stats.norm.cdf(stats.norm.isf(0.025) / np.sqrt(t)), atol=1e-7)
    assert old.boundaries[0] < b.boundaries[0]  # it spends more at the first look
    # one-sided designs: the same function at the one-sided level
    one = group_sequential_boundary(5, 0.025, "ld-obf", sides=1)
    assert np.allclose(one.boundaries, b.boundaries, atol=1e-6)


UNEQUAL = [
    ("ld-pocock", (0.15, 0.4, 0.7, 1.0), 2, 0.05),
    ("ld-obf", (0.25, 0.5, 0.6, 1.0), 2, 0.05),
    ("ld-obf-1983", (0.25, 0.5, 0.6, 1.0), 2, 0.05),
    ("hsd:-2", (0.1, 0.3, 0.65, 0.8, 1.0), 1, 0.025),
    ("hsd:1", (0.2, 0.5, 1.0), 2, 0.10),
    ("pocock", (0.3, 0.45, 1.0), 1, 0.05),
]


@pytest.mark.parametrize("spending,fractions,sides,alpha", UNEQUAL)
def test_unequal_fractions_against_multivariate_normal_cdf(spending, fractions, sides, alpha):
    b = group_sequential_boundary(len(fractions), alpha, spending, fractions=fractions, sides=sides)
    no_cross = _mvn_no_crossing(b.boundaries, fractions, sides)
    assert np.allclose(1.0 - no_cross, b.cumulative, atol=2e-5)
    if not spending.startswith("pocock"):  # spending functions: cumulative spent is the function itself
        name, _, g = spending.partition(":")
        expected = spending_function(name, float(g) if g else None, alpha, np.asarray(fractions), sides)
        assert np.allclose(b.cumulative, expected, atol=1e-7)


@pytest.mark.parametrize("spending,fractions,sides,alpha", UNEQUAL + [("obrien-fleming", (0.2, 0.4, 0.6, 0.8, 1.0), 2, 0.05)])
def test_total_type_one_error_by_monte_carlo(spending, fractions, sides, alpha):
    b = group_sequential_boundary(len(fractions), alpha, spending, fractions=fractions, sides=sides)
    z = _brownian_z(fractions, 1_000_000, np.random.default_rng(20261101))
    stat = np.abs(z) if sides == 2 else z
    rejected = (stat >= np.asarray(b.boundaries)).any(axis=1).mean()
    sd = math.sqrt(alpha * (1 - alpha) / 1_000_000)
    assert abs(rejected - alpha) < 4 * sd


def test_unadjusted_repeated_fixed_sample_test_fails_the_monte_carlo_check():
    # the same check catches a miscalibrated boundary: 1.96 at each of 5 looks gives ~0.14, not 0.05
    fractions = (0.2, 0.4, 0.6, 0.8, 1.0)
    z = _brownian_z(fractions, 1_000_000, np.random.default_rng(20261101))
    rejected = (np.abs(z) >= 1.96).any(axis=1).mean()
    assert abs(rejected - 0.05) > 4 * math.sqrt(0.05 * 0.95 / 1_000_000)
    assert rejected == pytest.approx(0.142, abs=0.005)  # Armitage et al. (1969), J&T Table 1.1


def test_futility_boundaries_non_binding_and_power():
    b = group_sequential_boundary(4, 0.025, "ld-obf", sides=1, beta=0.1, beta_spending="hsd:-2")
    assert b.futility is not None and b.power == pytest.approx(0.9, abs=1e-6)
    assert all(a <= u + 1e-12 for a, u in zip(b.futility, b.boundaries))
    assert b.futility[-1] == pytest.approx(b.boundaries[-1], abs=1e-6)
    # efficacy boundaries do not depend on futility (non-binding)
    plain = group_sequential_boundary(4, 0.025, "ld-obf", sides=1)
    assert b.boundaries == plain.boundaries
    # Monte Carlo under the design drift: power and futility stopping as designed
    z = _brownian_z(b.fractions, 400_000, np.random.default_rng(7)) + b.drift * np.sqrt(np.asarray(b.fractions))
    up, low = np.asarray(b.boundaries), np.asarray(b.futility)
    alive = np.ones(len(z), bool)
    reject = np.zeros(len(z), bool)
    for k in range(len(up)):
        reject |= alive & (z[:, k] >= up[k])
        alive &= (z[:, k] > low[k]) & (z[:, k] < up[k])
    assert reject.mean() == pytest.approx(0.9, abs=4 * math.sqrt(0.09 / 400_000))


def test_power_under_drift_is_increasing():
    b = group_sequential_boundary(5, 0.05, "pocock")
    powers = [crossing_probabilities(b, d).sum() for d in (0.0, 1.0, 2.0, 3.0)]
    assert powers[0] == pytest.approx(0.05, abs=1e-8)
    assert all(x < y for x, y in zip(powers, powers[1:]))


def test_interim_fractions_for_unplanned_looks_are_a_prefix_of_the_full_design():
    full = group_sequential_boundary(None, 0.05, "ld-pocock", fractions=(0.2, 0.45, 0.7, 1.0))
    part = group_sequential_boundary(None, 0.05, "ld-pocock", fractions=(0.2, 0.45), interim=True)
    assert np.allclose(part.boundaries, full.boundaries[:2], atol=1e-9)
    with pytest.raises(InputError, match="classical"):
        group_sequential_boundary(None, 0.05, "pocock", fractions=(0.2, 0.45), interim=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(looks=0), "looks"),
    (dict(looks=3, alpha=0.0), "alpha"),
    (dict(looks=3, alpha=1.2), "alpha"),
    (dict(looks=3, fractions=(0.5, 0.4, 1.0)), "increasing"),
    (dict(looks=3, fractions=(0.2, 0.5, 0.9)), "end at 1"),
    (dict(looks=3, fractions=(0.5, 1.0)), "one value per look"),
    (dict(looks=3, spending="foo"), "spending"),
    (dict(looks=3, spending="hsd:x"), "hsd"),
    (dict(looks=3, sides=3), "sides"),
    (dict(looks=3, beta=0.1), "one-sided"),
])
def test_bad_input_raises_one_line_input_error(kwargs, match):
    with pytest.raises(InputError, match=match) as info:
        group_sequential_boundary(**kwargs)
    assert "\n" not in str(info.value)


def test_cli_json_pocock(capsys):
    assert main(["bounds", "--looks", "5", "--alpha", "0.05", "--spending", "pocock", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"boundaries", "alpha_spent", "spending", "alpha", "sides"}
    assert np.allclose(out["boundaries"], 2.413, atol=1e-3)
    assert sum(out["alpha_spent"]) == pytest.approx(0.05, abs=1e-8)


def test_cli_obf_and_hsd_with_fractions(capsys):
    assert main(["bounds", "--looks", "5", "--spending", "obrien-fleming", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert np.allclose(out["boundaries"], [4.562, 3.226, 2.634, 2.281, 2.040], atol=1e-3)
    assert main(["bounds", "--looks", "3", "--spending", "hsd:-4", "--fractions", "0.3,0.6,1", "--sides", "1"]) == 0
    assert "hsd:-4" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--looks", "0"],
    ["--looks", "3", "--alpha", "1.5"],
    ["--looks", "3", "--alpha", "0"],
    ["--looks", "3", "--fractions", "0.5,0.4,1"],
    ["--looks", "3", "--fractions", "0.2,0.5,0.9"],
    ["--looks", "3", "--fractions", "0.5,1"],
    ["--looks", "3", "--spending", "nope"],
])
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    assert main(["bounds", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("certeval: error:") and err.count("\n") == 1
