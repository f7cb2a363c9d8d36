"""Comparative backtests: replay recorded scores for pairs, rankings and selections.

``certeval backtest --goal compare:D | rank:D | select:T,E`` lands here.  Each rep draws
one random item order shared by every model, reveals items in looks of ``looks_every``,
and compares the sequential decisions with the full-bank truth:

* compare: truth is the fixed-sample z-test on every shared item (same statistic, level
  alpha); a *directional error* is a verdict whose sign contradicts the bank difference;
* rank: a *family-wise error* is any pair ordered against its bank difference, or called
  equivalent while its bank difference exceeds the margin;
* select: an error is discarding a model whose bank mean is >= the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from ..banks import bank_from_scores, load_scores, read_table, score_matrix
from ..estimators._validation import InputError, check_confidence, check_positive_int
from ..estimators.comparison import A_GT_B, B_GT_A, EQUIVALENT, VERDICTS, ComparisonDesign, run_sequential_pairs
from ..estimators.ranking import rank_models
from ..estimators.selection import select_models
from ..estimators.sequential import mean_of_means


def parse_comparative_goal(text: str) -> tuple[str, tuple[float, ...]]:
    """``compare:D`` / ``rank:D`` → (kind, (margin,)); ``select:T,E`` → ('select', (T, E))."""
    if not isinstance(text, str) or ":" not in text:
        raise InputError(f"goal must look like compare:D, rank:D or select:T,E; got {text!r}")
    kind, _, raw = text.partition(":")
    kind = kind.strip().lower()
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        raise InputError(f"goal values must be numbers; got {raw!r} in {text!r}") from None
    if kind in ("compare", "rank"):
        if len(values) != 1 or not (0 <= values[0] < 1):
            raise InputError(f"goal {kind}:D needs one margin D in [0, 1); got {text!r}")
    elif kind == "select":
        if len(values) != 2 or not (0 <= values[0] <= 1) or not (0 < values[1] < 1):
            raise InputError(f"goal select:T,E needs a threshold T in [0, 1] and a half-width E in (0, 1); got {text!r}")
    else:
        raise InputError(f"comparative goal kind must be compare, rank or select; got {kind!r} in {text!r}")
    return kind, values


def _look_sizes(n: int, every: int, max_items: int | None) -> list[int]:
    cap = n if max_items is None else min(n, int(max_items))
    looks = list(range(every, cap, every)) + [cap]
    return looks


def _load(args) -> tuple[np.ndarray, list[str], np.ndarray | None, int | None]:
    scores = load_scores(args.scores)
    items = read_table(args.items, "items file") if getattr(args, "items", None) else None
    bank = bank_from_scores(scores, items)
    models = list(args.model) if getattr(args, "model", None) else sorted(scores["model"].unique())
    if len(set(models)) != len(models):
        raise InputError(f"--model lists a model twice: {models}")
    if len(models) < 2:
        raise InputError(f"a comparative backtest needs at least two models, got {models}")
    matrix = score_matrix(scores, models, bank)
    shared = ~np.isnan(matrix).any(axis=0)
    if not shared.any():
        raise InputError(f"the models {', '.join(models[:4])}{'...' if len(models) > 4 else ''} share no scored items")
    matrix = matrix[:, shared]
    subsets = n_subsets = None
    if bank.subsets is not None and len(bank.subset_names) > 1:
        codes = np.asarray(bank.subsets)[shared]
        _, subsets = np.unique(codes, return_inverse=True)
        n_subsets = int(subsets.max()) + 1
    return matrix, models, subsets, n_subsets


def _bank_weights(n: int, subsets, n_subsets) -> np.ndarray:
    """Per-item weights of the bank mean: 1/N, or 1/(S N_s) for the mean of S sub-dataset means."""
    if subsets is None:
        return np.full(n, 1.0 / n)
    sizes = np.bincount(subsets, minlength=n_subsets)
    return 1.0 / (n_subsets * sizes[subsets])


def _truth_pairs(a: np.ndarray, b: np.ndarray, alpha: float, statistic: str, subsets, n_subsets) -> tuple[np.ndarray, np.ndarray]:
    """Full-bank difference and fixed-sample z-test verdict per pair."""
    if statistic == "paired":
        diff, var = mean_of_means(a - b, subsets, n_subsets)
    else:
        ma, va = mean_of_means(a, subsets, n_subsets)
        mb, vb = mean_of_means(b, subsets, n_subsets)
        diff, var = ma - mb, va + vb
    z = special.ndtri(1 - alpha / 2)
    se = np.sqrt(var)
    verdict = np.where(diff - z * se > 0, A_GT_B, np.where(diff + z * se < 0, B_GT_A, 0))
    return diff, verdict


def _design(args, alpha: float, margin: float) -> ComparisonDesign:
    return ComparisonDesign(alpha=alpha, margin=margin, statistic=getattr(args, "statistic", "paired") or "paired",
                            spending=getattr(args, "spending", "pocock") or "pocock",
                            look_size=int(getattr(args, "looks_every", 100) or 100))


def compare_backtest(matrix, models, subsets, n_subsets, *, margin: float, alpha: float, design: ComparisonDesign,
                     reps: int, seed: int, n_pairs: int, looks_every: int, max_items: int | None) -> dict[str, Any]:
    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    ii, jj = np.triu_indices(m, k=1)
    if len(ii) > n_pairs:
        pick = rng.choice(len(ii), size=n_pairs, replace=False)
        ii, jj = ii[pick], jj[pick]
    a_all, b_all = matrix[ii], matrix[jj]
    true_diff, truth = _truth_pairs(a_all, b_all, alpha, design.statistic, subsets, n_subsets)
    looks = _look_sizes(n, looks_every, max_items)
    verdicts = np.zeros((reps, len(ii)), dtype=np.int64)
    used = np.zeros((reps, len(ii)))
    for r in range(reps):
        order = rng.permutation(n)
        sub = None if subsets is None else subsets[order]
        res = run_sequential_pairs(a_all[:, order], b_all[:, order], looks, design, n_total=n, subsets=sub,
                                   n_subsets=n_subsets)
        verdicts[r], used[r] = res["verdict"], res["used"]
    directional = np.isin(verdicts, (A_GT_B, B_GT_A))
    wrong_sign = ((verdicts == A_GT_B) & (true_diff <= 0)) | ((verdicts == B_GT_A) & (true_diff >= 0))
    wrong_equiv = (verdicts == EQUIVALENT) & (np.abs(true_diff) > margin)
    agree = verdicts == truth
    pairs = []
    for p in range(len(ii)):
        counts = np.bincount(verdicts[:, p], minlength=len(VERDICTS))
        pairs.append({
            "model_a": models[ii[p]], "model_b": models[jj[p]], "bank_diff": float(true_diff[p]),
            "truth": VERDICTS[int(truth[p])] if truth[p] else "undecided",
            "fraction_used": float(used[:, p].mean() / n),
            "separated": float(directional[:, p].mean()),
            "verdicts": {VERDICTS[v]: int(c) for v, c in enumerate(counts) if c},
            "agreement": float(agree[:, p].mean()),
            "error_rate": float((wrong_sign[:, p] | wrong_equiv[:, p]).mean()),
        })
    summary = {
        "pairs": len(ii), "reps": reps, "n_items": n, "looks": looks,
        "fraction_used": float(used.mean() / n),
        "separated": float(directional.mean()),
        "separated_before_exhaustion": float((directional & (used < n)).mean()),
        "equivalent": float((verdicts == EQUIVALENT).mean()),
        "full_bank_separated": float(np.isin(truth, (A_GT_B, B_GT_A)).mean()),
        "agreement": float(agree.mean()),
        "directional_error_rate": float(wrong_sign.mean()),
        "equivalence_error_rate": float(wrong_equiv.mean()),
        "guarantee": design.describe(),
    }
    return {"pairs": pairs, "summary": summary}


def rank_backtest(matrix, models, subsets, n_subsets, *, margin: float, alpha: float, design: ComparisonDesign,
                  reps: int, seed: int, looks_every: int, max_items: int | None) -> dict[str, Any]:
    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    looks = _look_sizes(n, looks_every, max_items)
    ii, jj = np.triu_indices(m, k=1)
    true_diff, _ = _truth_pairs(matrix[ii], matrix[jj], alpha, design.statistic, subsets, n_subsets)
    truth = {(models[i], models[j]): d for i, j, d in zip(ii, jj, true_diff)}
    rankings, fwe, fractions, groups = [], [], [], []
    for r in range(reps):
        order = rng.permutation(n)
        sub = None if subsets is None else subsets[order]
        ranking = rank_models(matrix[:, order], models, looks, alpha=alpha, margin=margin, design=design,
                              subsets=sub, n_subsets=n_subsets)
        errors = 0
        for c in ranking.comparisons:
            d = truth[(c.model_a, c.model_b)]
            if (c.verdict == "a>b" and d <= 0) or (c.verdict == "b>a" and d >= 0) or \
                    (c.verdict == "equivalent" and abs(d) > margin):
                errors += 1
        fwe.append(errors > 0)
        fractions.append(ranking.fraction_used)
        groups.append(len(ranking.tie_groups))
        entry = {"rep": r, "fraction_used": ranking.fraction_used, "errors": errors,
                 "tie_groups": [list(g) for g in ranking.tie_groups],
                 "models": list(ranking.models), "means": list(ranking.means), "items_used": list(ranking.items_used)}
        if r == 0:
            entry["comparisons"] = [c.to_dict() for c in ranking.comparisons]
        rankings.append(entry)
    full_means, _ = mean_of_means(matrix, subsets, n_subsets)
    summary = {
        "models": m, "pairs": len(ii), "reps": reps, "n_items": n, "looks": looks, "margin": margin,
        "fraction_used": float(np.mean(fractions)),
        "tie_groups_mean": float(np.mean(groups)),
        "family_wise_error_rate": float(np.mean(fwe)),
        "guarantee": "Bonferroni over pairs on the spending; " + design.describe(),
        "full_bank_order": [models[k] for k in np.argsort(-full_means, kind="stable")],
    }
    return {"rankings": rankings, "summary": summary}


def select_backtest(matrix, models, subsets, n_subsets, *, threshold: float, halfwidth: float, alpha: float,
                    spending: str, reps: int, seed: int, looks_every: int, max_items: int | None) -> dict[str, Any]:
    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    looks = _look_sizes(n, looks_every, max_items)
    full_means, _ = mean_of_means(matrix, subsets, n_subsets)
    runs, errors, fractions, covered = [], [], [], []
    for r in range(reps):
        order = rng.permutation(n)
        sub = None if subsets is None else subsets[order]
        sel = select_models(matrix[:, order], models, looks, threshold=threshold, halfwidth=halfwidth, alpha=alpha,
                            spending=spending, look_size=looks_every, subsets=sub, n_subsets=n_subsets)
        bad = [s.model for s in sel.models if s.status == "below" and full_means[models.index(s.model)] >= threshold]
        cover = all(s.lower <= full_means[models.index(s.model)] + 1e-12 and full_means[models.index(s.model)] <= s.upper + 1e-12
                    for s in sel.models)
        errors.append(bool(bad))
        covered.append(cover)
        fractions.append(sel.fraction_used)
        runs.append({"rep": r, "fraction_used": sel.fraction_used, "selected": list(sel.selected),
                     "discarded": list(sel.discarded), "wrongly_discarded": bad, "all_intervals_cover": cover,
                     **({"models": [vars(s) for s in sel.models]} if r == 0 else {})})
    summary = {
        "models": m, "reps": reps, "n_items": n, "threshold": threshold, "halfwidth": halfwidth,
        "fraction_used": float(np.mean(fractions)),
        "discarded_mean": float(np.mean([len(x["discarded"]) for x in runs])),
        "truly_below": int((full_means < threshold).sum()),
        "wrong_discard_rate": float(np.mean(errors)),
        "simultaneous_coverage": float(np.mean(covered)),
    }
    return {"runs": runs, "summary": summary}


# ----------------------------------------------------------------------------------------- bank target
def _bank_looks_run(update, looks: list[int], done) -> None:
    prev = 0
    for n_k in looks:
        if n_k > prev:
            update(prev, n_k)
            prev = n_k
        if done():
            break


def _statement_errors(verdict: np.ndarray, true_diff: np.ndarray, margin: float) -> np.ndarray:
    """Wrong ordering statements against the exact bank differences: a>b claims a difference above the
    margin, b>a below -margin, equivalent inside [-margin, margin]."""
    tol = 1e-9  # exact differences equal to the margin, up to floating point
    return (((verdict == A_GT_B) & (true_diff <= margin - tol)) | ((verdict == B_GT_A) & (true_diff >= -margin + tol))
            | ((verdict == EQUIVALENT) & (np.abs(true_diff) > margin + tol)))


def bank_compare_backtest(matrix, models, weights, *, margin: float, alpha: float, reps: int, seed: int,
                          n_pairs: int, looks_every: int, max_items: int | None) -> dict[str, Any]:
    """Each sampled pair on its own (level alpha per pair), bank target: without-replacement CS on the paired
    difference of the bank's weighted means, items drawn ∝ weight; truth is the exact bank difference."""
    from ..estimators.comparison import pair_verdicts
    from ..estimators.wor_streams import absorb_rows, make_streams, weighted_order

    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    ii, jj = np.triu_indices(m, k=1)
    if len(ii) > n_pairs:
        pick = rng.choice(len(ii), size=n_pairs, replace=False)
        ii, jj = ii[pick], jj[pick]
    true_diff = (matrix[ii] - matrix[jj]) @ weights
    looks = _look_sizes(n, looks_every, max_items)
    verdicts = np.zeros((reps, len(ii)), dtype=np.int64)
    used = np.zeros((reps, len(ii)))
    covered = np.ones((reps, len(ii)), dtype=bool)
    for r in range(reps):
        order = weighted_order(weights, rng)
        x = (matrix[ii][:, order] - matrix[jj][:, order] + 1.0) / 2.0
        w_order = weights[order]
        streams = make_streams(len(ii), n, alpha)
        open_ = np.ones(len(ii), dtype=bool)

        def update(start, stop):
            rows = np.flatnonzero(open_)
            absorb_rows(streams, rows, x[rows, start:stop], w_order[start:stop])
            mean, lo, up = (v[rows] for v in streams.bounds())
            diff, lower, upper = 2 * mean - 1, 2 * lo - 1, 2 * up - 1
            codes = pair_verdicts(diff, lower, upper, margin, stop == n)
            covered[r, rows] &= (lower <= true_diff[rows] + 1e-12) & (true_diff[rows] <= upper + 1e-12)
            used[r, rows] = stop
            verdicts[r, rows] = codes
            open_[rows[codes != 0]] = False

        _bank_looks_run(update, looks, lambda: not open_.any())
    wrong = _statement_errors(verdicts, true_diff, margin)
    directional = np.isin(verdicts, (A_GT_B, B_GT_A))
    pairs = []
    for p in range(len(ii)):
        counts = np.bincount(verdicts[:, p], minlength=len(VERDICTS))
        pairs.append({
            "model_a": models[ii[p]], "model_b": models[jj[p]], "bank_diff": float(true_diff[p]),
            "truth": VERDICTS[int(pair_verdicts(true_diff[p:p + 1], None, None, margin, True)[0])],
            "fraction_used": float(used[:, p].mean() / n), "separated": float(directional[:, p].mean()),
            "verdicts": {VERDICTS[v]: int(k) for v, k in enumerate(counts) if k},
            "agreement": float((verdicts[:, p] == pair_verdicts(true_diff[p:p + 1], None, None, margin, True)[0]).mean()),
            "error_rate": float(wrong[:, p].mean()), "coverage": float(covered[:, p].mean()),
        })
    truth = pair_verdicts(true_diff, None, None, margin, True)
    summary = {
        "target": "bank", "pairs": len(ii), "reps": reps, "n_items": n, "looks": looks, "margin": margin,
        "fraction_used": float(used.mean() / n), "separated": float(directional.mean()),
        "separated_before_exhaustion": float((directional & (used < n)).mean()),
        "equivalent": float((verdicts == EQUIVALENT).mean()),
        "full_bank_separated": float(np.isin(truth, (A_GT_B, B_GT_A)).mean()),
        "agreement": float((verdicts == truth).mean()), "coverage": float(covered.mean()),
        "directional_error_rate": float((wrong & directional).mean()),
        "equivalence_error_rate": float((wrong & (verdicts == EQUIVALENT)).mean()),
        "guarantee": f"bank target: without-replacement {streams.CONSTRUCTION} CS per pair (Waudby-Smith & Ramdas 2020), "
                     f"items drawn in proportion to their weights, level {1 - alpha:g} per pair, exact at exhaustion",
    }
    return {"pairs": pairs, "summary": summary}


def bank_rank_backtest(matrix, models, weights, *, margin: float, alpha: float, reps: int, seed: int,
                       looks_every: int, max_items: int | None, correction: str = "bonferroni") -> dict[str, Any]:
    """Bank-target rankings over ``reps`` random item orders; a family-wise error is any wrong ordering statement
    against the exact bank differences. Memory: O(pairs) arrays, nothing per pair per rep (M ~ 2000 fits)."""
    import time

    from ..estimators.bank_ranking import bank_rank
    from ..estimators.wor_streams import weighted_order

    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    looks = _look_sizes(n, looks_every, max_items)
    exact = matrix @ weights
    rankings, fwe, fractions, groups, walls, early = [], [], [], [], [], []
    true_diff = None
    for r in range(reps):
        order = weighted_order(weights, rng)
        start = time.perf_counter()
        rank = bank_rank(matrix[:, order], models, looks, alpha=alpha, margin=margin, weights=weights[order],
                         correction=correction)
        res = rank.result()
        walls.append(time.perf_counter() - start)
        if true_diff is None:
            true_diff = exact[rank.pa] - exact[rank.pb]
        errors = int(_statement_errors(rank.verdict, true_diff, margin).sum())
        fwe.append(errors > 0)
        fractions.append(res.fraction_used)
        groups.append(len(res.tie_groups))
        early.append(float(np.mean(np.asarray(res.items_used) < n)))
        entry = {"rep": r, "fraction_used": res.fraction_used, "errors": errors, "n_tie_groups": len(res.tie_groups),
                 "models_leaving_early": early[-1]}
        if r == 0:
            entry.update(tie_groups=[list(g) for g in res.tie_groups], models=list(res.models), means=list(res.means),
                         items_used=list(res.items_used))
            if len(rank.pa) <= 5000:
                entry["comparisons"] = [c.to_dict() for c in res.comparisons]
        rankings.append(entry)
    summary = {
        "target": "bank", "models": m, "pairs": m * (m - 1) // 2, "reps": reps, "n_items": n, "looks": looks,
        "margin": margin, "fraction_used": float(np.mean(fractions)), "tie_groups_mean": float(np.mean(groups)),
        "models_leaving_early": float(np.mean(early)), "family_wise_error_rate": float(np.mean(fwe)),
        "wall_s_per_rep": float(np.mean(walls)), "correction": correction,
        "guarantee": rank.guarantee(),
        "full_bank_order": [models[k] for k in np.argsort(-exact, kind="stable")],
    }
    return {"rankings": rankings, "summary": summary}


def bank_select_backtest(matrix, models, weights, *, threshold: float, halfwidth: float, alpha: float, top: int,
                         reps: int, seed: int, looks_every: int, max_items: int | None) -> dict[str, Any]:
    """Best-arm (top-K within epsilon = halfwidth) identification on the bank target."""
    from ..estimators.bank_selection import BankSelection
    from ..estimators.wor_streams import weighted_order

    m, n = matrix.shape
    rng = np.random.default_rng(seed)
    looks = _look_sizes(n, looks_every, max_items)
    exact = matrix @ weights
    kth = np.sort(exact)[::-1][min(top, m) - 1]
    runs, errors, fractions = [], [], []
    for r in range(reps):
        order = weighted_order(weights, rng)
        sel = BankSelection(models, alpha=alpha, top=top, epsilon=halfwidth, threshold=threshold).start(weights[order])
        x = matrix[:, order]

        def update(start, stop):
            live = np.array([s == "running" for s in sel.status])
            sel.update(np.arange(start, stop), np.where(live[:, None], x[:, start:stop], np.nan))

        _bank_looks_run(update, looks, lambda: sel.finished)
        res = sel.result()
        chosen = [models.index(s) for s in res.selected]
        bad = [models[k] for k in chosen if exact[k] < kth - halfwidth]
        bad += [s.model for s in res.models if s.status == "below" and exact[models.index(s.model)] >= threshold]
        errors.append(bool(bad))
        fractions.append(res.fraction_used)
        runs.append({"rep": r, "fraction_used": res.fraction_used, "selected": list(res.selected),
                     "discarded": list(res.discarded), "wrong": bad,
                     **({"models": [vars(s) for s in res.models]} if r == 0 else {})})
    summary = {
        "target": "bank", "models": m, "reps": reps, "n_items": n, "top": top, "epsilon": halfwidth,
        "threshold": threshold, "fraction_used": float(np.mean(fractions)),
        "discarded_mean": float(np.mean([len(x["discarded"]) for x in runs])),
        "truly_below": int((exact < threshold).sum()), "error_rate": float(np.mean(errors)),
        "wrong_discard_rate": float(np.mean(errors)),
        "simultaneous_coverage": None,
    }
    return {"runs": runs, "summary": summary}


def run_comparative_backtest(args) -> int:
    """Entry point for ``certeval backtest --goal compare:D | rank:D | select:T,E``; returns the exit code."""
    kind, values = parse_comparative_goal(args.goal)
    alpha = 1.0 - check_confidence(getattr(args, "confidence", 0.95))
    reps = check_positive_int(getattr(args, "reps", 10) or 10, "--reps")
    seed = int(getattr(args, "seed", 0) or 0)
    looks_every = check_positive_int(getattr(args, "looks_every", 100) or 100, "--looks-every")
    max_items = getattr(args, "max_items", None)
    if max_items is not None:
        max_items = check_positive_int(max_items, "--max-items")
    matrix, models, subsets, n_subsets = _load(args)
    common = dict(alpha=alpha, reps=reps, seed=seed, looks_every=looks_every, max_items=max_items)
    target = getattr(args, "target", "bank") or "bank"
    if target == "bank":
        weights = _bank_weights(matrix.shape[1], subsets, n_subsets)
        if kind == "compare":
            n_pairs = check_positive_int(getattr(args, "pairs", 200) or 200, "--pairs")
            out = bank_compare_backtest(matrix, models, weights, margin=values[0], n_pairs=n_pairs, **common)
        elif kind == "rank":
            out = bank_rank_backtest(matrix, models, weights, margin=values[0], **common)
        else:
            top = check_positive_int(getattr(args, "top", None) or 1, "--top")
            out = bank_select_backtest(matrix, models, weights, threshold=values[0], halfwidth=values[1], top=top,
                                       **common)
    elif kind == "compare":
        design = _design(args, alpha, values[0])
        n_pairs = check_positive_int(getattr(args, "pairs", 200) or 200, "--pairs")
        out = compare_backtest(matrix, models, subsets, n_subsets, margin=values[0], design=design, n_pairs=n_pairs,
                               **common)
    elif kind == "rank":
        design = _design(args, alpha, values[0])
        out = rank_backtest(matrix, models, subsets, n_subsets, margin=values[0], design=design, **common)
    else:
        out = select_backtest(matrix, models, subsets, n_subsets, threshold=values[0], halfwidth=values[1],
                              spending=getattr(args, "spending", "pocock") or "pocock", **common)
    out["config"] = {"goal": args.goal, "target": target, "scores": str(args.scores), "confidence": 1 - alpha, "reps": reps,
                     "seed": seed, "looks_every": looks_every, "max_items": max_items,
                     "statistic": getattr(args, "statistic", "paired"), "spending": getattr(args, "spending", "pocock")}
    if getattr(args, "json", False):
        from ..cli._common import print_json

        print_json(out)
    else:
        from .tables import print_compare, print_rank, print_select

        {"compare": print_compare, "rank": print_rank, "select": print_select}[kind](out)
    return 0


__all__ = ["parse_comparative_goal", "run_comparative_backtest", "compare_backtest", "rank_backtest",
           "select_backtest"]
