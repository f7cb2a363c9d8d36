"""The tables ``certeval backtest`` prints for a comparative backtest without ``--json`` (rich; rep 0 in detail,
every rep summarised)."""

from __future__ import annotations

from typing import Any


def print_compare(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = out["summary"]
    table = Table(title=f"pairwise backtest: {s['pairs']} pairs x {s['reps']} orders, {s['n_items']} shared items")
    for col in ("model A", "model B", "bank diff", "truth", "items used", "separated", "agree", "errors"):
        table.add_column(col)
    for p in out["pairs"][:40]:
        table.add_row(p["model_a"], p["model_b"], f"{p['bank_diff']:+.3f}", p["truth"], f"{p['fraction_used']:.2f}",
                      f"{p['separated']:.2f}", f"{p['agreement']:.2f}", f"{p['error_rate']:.2f}")
    console = Console()
    console.print(table)
    if len(out["pairs"]) > 40:
        console.print(f"... {len(out['pairs']) - 40} more pairs (--json for all)")
    console.print(f"items used {s['fraction_used']:.3f} of the bank; pairs separated {s['separated']:.3f} "
                  f"(full-bank fixed test {s['full_bank_separated']:.3f}); agreement {s['agreement']:.3f}; "
                  f"directional errors {s['directional_error_rate']:.4f}")
    console.print(f"guarantee: {s['guarantee']}")


def print_rank(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = out["summary"]
    first = out["rankings"][0]
    statement = (f"margin {s['margin']:g}" if s.get("epsilon") is None
                 else f"epsilon {s['epsilon']:g}: each listed at least the models below it minus epsilon")
    table = Table(title=f"ranking (rep 0): {s['models']} models, {statement}, {len(first['tie_groups'])} tie groups")
    for col in ("rank", "model", "mean", "items used"):
        table.add_column(col)
    pos = {mname: k for k, mname in enumerate(first["models"])}
    for g, group in enumerate(first["tie_groups"]):
        for j, model in enumerate(group):
            k = pos[model]
            table.add_row(str(g + 1) if j == 0 else "", model, f"{first['means'][k]:.3f}", str(first["items_used"][k]),
                          end_section=j == len(group) - 1)
    console = Console()
    console.print(table)
    console.print(f"over {s['reps']} orders: items used {s['fraction_used']:.3f} of models x items; "
                  f"tie groups {s['tie_groups_mean']:.1f} on average; family-wise error rate "
                  f"{s['family_wise_error_rate']:.3f}")
    print_history(console, s)


def print_history(console: Any, summary: dict[str, Any]) -> None:
    """The history share's line, when the backtest had one."""
    h = summary.get("history")
    if h:
        console.print(f"history: {h['history_models']} of the models per rep at random ({h['run_models']} run); "
                      f"{h['rule']}")
    if summary.get("fraction_used_without_history") is not None:
        console.print(f"without history (the same models, the same orders): items used "
                      f"{summary['fraction_used_without_history']:.3f}; with ÷ without "
                      f"{summary['history_vs_without']:.3f}")


def print_select(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = out["summary"]
    # the bank target states its tolerance as epsilon (top-K within epsilon), the distribution one as a half-width
    width = (f"epsilon {s['epsilon']:g}, top {s.get('top')}" if "epsilon" in s else f"half-width {s['halfwidth']:g}")
    table = Table(title=f"selection (rep 0): threshold {s['threshold']:g}, {width}")
    for col in ("model", "status", "mean", "lower", "upper", "items"):
        table.add_column(col)
    for mdl in sorted(out["runs"][0]["models"], key=lambda x: -x["mean"]):
        table.add_row(mdl["model"], mdl["status"], f"{mdl['mean']:.3f}", f"{mdl['lower']:.3f}", f"{mdl['upper']:.3f}",
                      str(mdl["n_scored"]))
    console = Console()
    console.print(table)
    console.print(f"over {s['reps']} orders: items used {s['fraction_used']:.3f}; discarded {s['discarded_mean']:.1f} "
                  f"models on average ({s['truly_below']} truly below); wrong discards {s['wrong_discard_rate']:.3f}; "
                  + (f"simultaneous coverage {s['simultaneous_coverage']:.3f}" if s.get("simultaneous_coverage") is not None
                     else f"errors (not an epsilon-top-{s.get('top')} or a wrong drop) {s.get('error_rate', 0):.3f}"))
    print_history(console, s)


def print_certify(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="certify (rep 0): each model's interval on the recorded scores")
    for col in ("model", "mean", "interval", "exact", "items used", "rule"):
        table.add_column(col)
    for m in out["runs"][0]["models"]:
        table.add_row(m["model"], f"{m['mean']:.4f}", f"[{m['lower']:.4f}, {m['upper']:.4f}]", f"{m['exact']:.4f}",
                      str(m["n_scored"]), str(m["rule"]))
    s = out["summary"]
    console = Console()
    console.print(table)
    console.print(f"over {s['reps']} reps: goal reached {s['reached']:.3f}; intervals missing the exact bank mean "
                  f"{s['miss_rate']:.4f}")
