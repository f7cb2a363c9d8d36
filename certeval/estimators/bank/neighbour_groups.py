"""Tie groups of the neighbour ε-ranking (:mod:`.neighbour_ranking`) without a pass over all pairs: the strongly
connected components of its required listings, from the model intervals' order and the opened pairs, or (while the
unopened candidates exceed the opening budget) groups cut from the midpoint order."""

from __future__ import annotations

from typing import Any

import numpy as np


def neighbour_groups(rank: Any, means: np.ndarray, cert_a: np.ndarray,
                     cert_b: np.ndarray) -> list[list[int]]:
    """Tie groups of a :class:`~.neighbour_ranking.NeighbourRanking`, best first: the strongly connected components of its required
    listings (x → y when "y above x" is not certified: x must be listed above y, or with it), in a topological order —
    as :func:`~.ranking.epsilon_groups`, without a pass over all pairs.

    Models are ordered by interval midpoint, descending. A listing certified by the model CSs for one order only —
    ``lower_x + ε ≥ upper_y`` but not ``lower_y + ε ≥ upper_x`` — implies ``mid_x > mid_y``, so a pair that was never
    opened (settled by the CSs) never requires the later model above the earlier one: every backward edge comes
    from an opened pair. Forward edges: from model x at position i to every later model except those with "y above
    x" certified (CS: ``lower_y ≥ upper_x − ε``; or an opened pair's test); the last such exception is at position
    ``q − 1`` (a suffix maximum of the lower bounds, and the opened pairs), so x gets explicit edges to the positions
    in ``(i, q)`` and one edge to a chain node ``c_q`` (``c_p → c_{p+1}``, ``c_p →`` the model at p) that reaches
    exactly the models from q on. Scipy's strong components of this graph — O(M + opened pairs + near edges) —
    are the exact groups; a layered topological sort orders them (higher best mean first within a layer).

    Pairs of pending models (not all their pairs opened yet) that nothing settles are undecided: an edge each way
    (the forward one is there already; the backward one is added). While their windows hold more than the opening
    budget the groups are cut from the midpoint order instead (:func:`_cut_groups`: coarser, valid)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    m = len(rank.names)
    undecided = rank.unopened_unsettled(rank.open_budget) if rank.pending.any() else (np.zeros(0, int),) * 2
    if undecided is None:
        return _cut_groups(rank, means, cert_a, cert_b)
    lower, upper, eps = rank.model_lower, rank.model_upper, rank.epsilon
    mid = (lower + upper) / 2.0
    order = np.lexsort((np.arange(m), -means, -mid))
    pos = np.empty(m, dtype=np.int64)
    pos[order] = np.arange(m)
    pa, pb = rank.pa.astype(np.int64), rank.pb.astype(np.int64)
    a_first = pos[pa] < pos[pb]
    x, y = np.where(a_first, pa, pb), np.where(a_first, pb, pa)
    x_over_y = np.where(a_first, cert_a, cert_b)  # the earlier one listed above: certified
    y_over_x = np.where(a_first, cert_b, cert_a)
    # q: first position from which x has an edge to every later model
    last = np.arange(m)
    np.maximum.at(last, pos[x[y_over_x]], pos[y[y_over_x]])
    suffix = np.maximum.accumulate(lower[order][::-1])[::-1]  # nonincreasing in position
    cs_last = np.searchsorted(-suffix, -(upper[order] - eps), side="right") - 1  # last p with lower >= upper_x − ε
    q = np.maximum(last, cs_last) + 1
    span = q - np.arange(m) - 1
    i = np.repeat(np.arange(m), span)
    j = i + 1 + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    xi, yj = order[i], order[j]
    absent = lower[yj] + eps >= upper[xi]
    if len(pa):
        idx = rank._lookup(xi, yj)
        hit = idx >= 0
        h = idx[hit]
        cert_y = np.where(pa[h] == yj[hit], cert_a[h], cert_b[h])  # "y above x" certified by the pair
        absent[hit] |= cert_y
    ua, ub = undecided
    u_later = np.where(pos[ua] > pos[ub], ua, ub)
    src = [xi[~absent], y[~x_over_y], u_later, m + np.arange(m - 1), m + np.arange(m), order[q < m]]
    dst = [yj[~absent], x[~x_over_y], ua + ub - u_later, m + np.arange(1, m), order, m + q[q < m]]
    src, dst = np.concatenate(src), np.concatenate(dst)
    n_nodes = 2 * m
    graph = coo_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n_nodes, n_nodes)).tocsr()
    n_comp, label = connected_components(graph, directed=True, connection="strong")
    # the condensation, sorted topologically in layers
    cs, cd = label[src], label[dst]
    keep = cs != cd
    ckey = np.unique(cs[keep].astype(np.int64) * n_comp + cd[keep])
    cs, cd = ckey // n_comp, ckey % n_comp
    indeg = np.bincount(cd, minlength=n_comp)
    starts = np.searchsorted(cs, np.arange(n_comp + 1))
    best = np.full(n_comp, -np.inf)
    np.maximum.at(best, label[:m], means)
    frontier = np.flatnonzero(indeg == 0)
    topo = []
    while len(frontier):
        frontier = frontier[np.argsort(-best[frontier], kind="stable")]
        topo.append(frontier)
        lo, hi = starts[frontier], starts[frontier + 1]
        cnt = hi - lo
        succ = cd[np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))]
        np.subtract.at(indeg, succ, 1)
        frontier = np.unique(succ[indeg[succ] == 0])
    rank_of = np.empty(n_comp, dtype=np.int64)
    rank_of[np.concatenate(topo)] = np.arange(n_comp)
    model_rank = rank_of[label[:m]]
    by = np.lexsort((np.arange(m), -means, model_rank))
    cuts = np.flatnonzero(np.diff(model_rank[by])) + 1
    return [[int(k) for k in g] for g in np.split(by, cuts)]


def _cut_groups(rank: Any, means: np.ndarray, cert_a: np.ndarray, cert_b: np.ndarray) -> list[list[int]]:
    """Groups cut from the midpoint order: a pair blocks the cuts between its two models' positions when the listing
    this order makes is not certified — an opened pair whose certificate is the other way round or missing, or any
    partner after a pending model whose upper bound exceeds the model's lower bound + ε (more than needed: valid).
    Cuts no pair blocks split the order into segments; every pair across segments is certified in the listed
    order; members by mean."""
    m = len(rank.names)
    lower, upper, eps = rank.model_lower, rank.model_upper, rank.epsilon
    mid = (lower + upper) / 2.0
    order = np.lexsort((np.arange(m), -means, -mid))
    pos = np.empty(m, dtype=np.int64)
    pos[order] = np.arange(m)
    reach = np.arange(m)
    pa, pb = rank.pa.astype(np.int64), rank.pb.astype(np.int64)
    if len(pa):
        a_first = pos[pa] < pos[pb]
        x, y = np.where(a_first, pa, pb), np.where(a_first, pb, pa)
        ok = np.where(a_first, cert_a, cert_b)
        np.maximum.at(reach, pos[x[~ok]], pos[y[~ok]])
    up_sorted = upper[order]
    sufmax = np.maximum.accumulate(up_sorted[::-1])[::-1]  # nonincreasing
    px = np.flatnonzero(rank.pending[order])
    last = np.searchsorted(-sufmax, -(lower[order[px]] + eps), side="left") - 1  # last position with upper > thr
    reach[px] = np.maximum(reach[px], last)
    ends = np.flatnonzero(np.maximum.accumulate(reach) <= np.arange(m))
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [[int(k) for k in seg[np.lexsort((seg, -means[seg]))]]
            for seg in (order[s:e + 1] for s, e in zip(starts, ends))]


__all__ = ["neighbour_groups"]
