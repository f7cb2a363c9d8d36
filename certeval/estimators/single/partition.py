"""Wang et al. 2025, arXiv:2505.03814, Algorithm 2: partition the bank by a 1-nearest-neighbour classifier on item embeddings.

For k = 1, …, ⌈ln|S|⌉ + 1 the scored points get the label ⌊k Z_i⌋, a 1-NN
classifier (scikit-learn ``KNeighborsClassifier(n_neighbors=1)``) trained on
them labels every item of the bank, and the candidate partition's weighted
radius ε̃_k = Σ_j N_j ε_j / N (Alg. 1 lines 6–11) is computed; the k with the
smallest ε̃_k wins. Strata refine the sub-datasets when the estimand is a
mean-of-means, so items inside a stratum always carry equal weight.

The 1-NN neighbour of every item does not depend on the labelling, so the
classifier is fitted once and its neighbour indices reused for every k (the
same labels as fitting one classifier per k). Between re-fits only the newly
scored points can become an item's nearest neighbour, so :func:`update_nearest`
keeps each item's nearest scored point and its distance and compares every item
with the new points only: O(N · new) per re-fit instead of O(N · |S|), exactly
the full 1-NN up to ties between equidistant points (the earlier point is kept).
Deviation from the printed text: Alg. 2 line 3 trains on "a random subset of S"
without saying which; we use all of S.
"""

from __future__ import annotations

import math

import numpy as np

from .bounds import cereval_radius


def stratum_stats(codes: np.ndarray, scored: np.ndarray, scores: np.ndarray, weights: np.ndarray, n_codes: int):
    """Per stratum: total weight W_j, size N_j, scored count n_j, mean R̂_j and variance v_j (Alg. 1 lines 6–9)."""
    w = np.bincount(codes, weights=weights, minlength=n_codes)
    size = np.bincount(codes, minlength=n_codes)
    sc = codes[scored]
    z = scores[scored]
    n = np.bincount(sc, minlength=n_codes)
    s = np.bincount(sc, weights=z, minlength=n_codes)
    ss = np.bincount(sc, weights=z * z, minlength=n_codes)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, s / np.maximum(n, 1), np.nan)
        var = np.where(n > 0, np.maximum(ss / np.maximum(n, 1) - np.nan_to_num(mean) ** 2, 0.0), np.nan)
    return w, size, n, mean, var


def weighted_radius(codes, scored, scores, weights, n_codes, delta) -> float:
    """ε̃ = Σ_j W_j ε_j over the non-empty strata of a labelling (Alg. 2 line 8)."""
    w, size, n, _, var = stratum_stats(codes, scored, scores, weights, n_codes)
    live = size > 0
    k_strata = int(live.sum())
    eps = cereval_radius(n[live], np.nan_to_num(var[live]), k_strata, delta)
    return float(w[live] @ eps)


def update_nearest(
    features: np.ndarray, new: np.ndarray, nearest: np.ndarray | None = None, dist: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each item's nearest scored point after the points ``new`` were scored.

    ``nearest``/``dist`` hold the answer for the points scored before (``None``: none yet).
    Returns new arrays (inputs are not modified); a scored point is its own neighbour at
    distance 0, also when another point shares its embedding.
    """
    new = np.asarray(new, dtype=np.int64)
    n_items = features.shape[0]
    if nearest is None or dist is None:
        nearest, dist = np.full(n_items, -1, dtype=np.int64), np.full(n_items, np.inf)
    nearest, dist = nearest.copy(), dist.copy()
    if new.size == 0:
        return nearest, dist
    from sklearn.neighbors import NearestNeighbors  # here, not at import: 0.5-1.5 s every command would pay

    d_new, j_new = NearestNeighbors(n_neighbors=1).fit(features[new]).kneighbors(features)
    d_new, j_new = d_new[:, 0], new[j_new[:, 0]]
    closer = d_new < dist  # strict: an equidistant earlier point keeps its place
    nearest[closer], dist[closer] = j_new[closer], d_new[closer]
    nearest[new], dist[new] = new, 0.0
    return nearest, dist


def nn_partition(
    features: np.ndarray,
    scored: np.ndarray,
    scores: np.ndarray,
    base_codes: np.ndarray,
    weights: np.ndarray,
    delta: float,
    nearest: np.ndarray | None = None,
) -> np.ndarray:
    """Alg. 2: the best 1-NN partition (stratum code per item, 0..K−1), refined by ``base_codes``.

    ``nearest`` (each item's nearest scored point, from :func:`update_nearest`) saves the
    1-NN search; without it the search runs over every scored point.
    """
    idx = np.flatnonzero(scored)
    n_base = int(base_codes.max()) + 1
    if nearest is None:
        nearest, _ = update_nearest(features, idx)
    best, best_codes = math.inf, base_codes
    for k in range(1, int(math.ceil(math.log(idx.size))) + 2):
        labels = np.minimum(np.floor(k * scores[nearest]).astype(np.int64), k)  # ⌊kZ⌋ ∈ {0..k}
        codes = labels * n_base + base_codes
        radius = weighted_radius(codes, scored, np.nan_to_num(scores), weights, (k + 1) * n_base, delta)
        if radius < best:
            best, best_codes = radius, codes
    _, compact = np.unique(best_codes, return_inverse=True)
    return compact.astype(np.int64)
