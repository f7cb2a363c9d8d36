"""How tests/data/backtest_removed_driver.json was made: fixed-seed results of the removed backtest driver
(``run_single_backtest``'s own rep loop and seeding, ``SeedSequence(seed, spawn_key=(model index, rep))``), run at
commit 5da5bb3 before the CLI's backtest moved onto the one driver (``certeval.backtests.ray_fanout.run_cells``).
Kept for provenance; run today it gives the kept driver's numbers. Used by tests/test_backtest_driver.py."""
import json
import time

from certeval.backtests.single import SingleBacktestOptions, run_single_backtest
from certeval.estimators import parse_goal
from certeval.inputs.banks import bank_from_scores, load_scores

frame = load_scores("bundled:helm_mmlu")
bank = bank_from_scores(frame)
models = sorted(frame.model.unique())[::2]  # 22 of the 44 models
cases = {
    "uniform_hw05": dict(method="uniform", goal="halfwidth:0.05", reps=6),
    "adaptive_hw05": dict(method="adaptive", goal="halfwidth:0.05", reps=6),
    "seq_above05_budget": dict(method="seq", goal="above:0.5", reps=10, max_items=300),
    "history_frac05_hw05": dict(method="history", goal="halfwidth:0.05", reps=3, history_fraction=0.5, baseline="uniform"),
}
out = {"commit": "5da5bb3", "seed": 11, "scores": "bundled:helm_mmlu", "cases": {}}
for name, c in cases.items():
    c = dict(c)
    t = time.time()
    options = SingleBacktestOptions(c.pop("method"), parse_goal(c.pop("goal")), seed=11, batch_size=10, **c)
    res = run_single_backtest(frame, bank, models, options, all_models=sorted(frame.model.unique()))
    out["cases"][name] = res
    print(name, round(time.time() - t, 1), res["summary"])
json.dump(out, open("tests/data/backtest_removed_driver.json", "w"), indent=1, sort_keys=True)
