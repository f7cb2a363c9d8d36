"""The synthetic scenarios S1–S3 of Wang et al. 2025, arXiv:2505.03814 §6.1 (numpy and the standard library only).

K groups; a point of group k has features X ~ N(c_k, σ² I_d) with
c_k = (λ k, 0, …, 0) and a loss drawn from a Gaussian with mean (k − ½)/K and
standard deviation 1/K truncated to [0, 1] (the loss range). Groups are equally
likely. S1: K = 1. S2: K = 3, λ = 5 (easy to separate). S3: K = 3, λ = 1
(hard). Defaults n = 5000, d = 10, σ² = 1 as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from certeval.errors import InputError

from .validation import check_positive, check_positive_int

SCENARIOS = {"S1": (1, 5.0), "S2": (3, 5.0), "S3": (3, 1.0)}  # name -> (K, λ)


@dataclass(frozen=True)
class SyntheticBank:
    features: np.ndarray  # (n, d)
    losses: np.ndarray  # (n,) in [0, 1]
    groups: np.ndarray  # (n,) true group 0..K−1
    population_mean: float  # E[loss] under the generating distribution

    @property
    def bank_mean(self) -> float:
        return float(self.losses.mean())


def _phi(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def truncated_normal_mean(mu: float, sd: float, low: float = 0.0, high: float = 1.0) -> float:
    """Mean of N(mu, sd²) truncated to [low, high]: mu + sd (φ(a) − φ(b)) / (Φ(b) − Φ(a))."""
    a, b = (low - mu) / sd, (high - mu) / sd
    return mu + sd * (_phi(a) - _phi(b)) / (_cdf(b) - _cdf(a))


def _truncated_normal(rng: np.random.Generator, mu: np.ndarray, sd: float) -> np.ndarray:
    """Rejection sampling on [0, 1] (acceptance ≥ 0.47 for the scenarios' parameters)."""
    out = rng.normal(mu, sd)
    bad = (out < 0.0) | (out > 1.0)
    while bad.any():
        out[bad] = rng.normal(mu[bad], sd)
        bad = (out < 0.0) | (out > 1.0)
    return out


def make_scenario(name: str, rng: np.random.Generator, n: int = 5000, d: int = 10, sigma2: float = 1.0) -> SyntheticBank:
    """Draw one bank of scenario ``S1``, ``S2`` or ``S3``."""
    if name not in SCENARIOS:
        raise InputError(f"scenario must be one of {', '.join(SCENARIOS)}; got {name!r}")
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d")
    sigma = math.sqrt(check_positive(sigma2, "sigma2"))
    n_groups, lam = SCENARIOS[name]
    groups = rng.integers(0, n_groups, size=n)
    k = groups + 1
    features = rng.normal(0.0, sigma, size=(n, d))
    features[:, 0] += lam * k
    means = (k - 0.5) / n_groups
    losses = _truncated_normal(rng, means.astype(float), 1.0 / n_groups)
    pop = float(np.mean([truncated_normal_mean((j - 0.5) / n_groups, 1.0 / n_groups) for j in range(1, n_groups + 1)]))
    return SyntheticBank(features, losses, groups, pop)
