"""Helpers of ``python -m benchmarks readme_tables`` (numbers, tables, a result's provenance line) and its scale
section (the Prefect + Ray runs and the neighbour ε-rankings at leaderboard scale)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _load(name: str, results_dir: Path) -> dict[str, Any] | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _f(x: Any, digits: int = 2, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if pct:
        return f"{100 * x:.0f}%"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _meta_line(doc: dict[str, Any]) -> str:
    meta = doc.get("meta") or {}
    m = meta.get("machine") or doc.get("machine") or {}
    cmd = meta.get("command") or "?"
    return (f"_Made by `{cmd}` at {meta.get('timestamp_utc', '?')}, commit `{meta.get('git_commit') or doc.get('git_commit')}`, "
            f"{m.get('cpus_usable') or m.get('cpus') or m.get('cpu_count')} CPUs ({m.get('processor') or '?'}), "
            f"load average at start {m.get('load_avg_at_start', '?')}; seed {meta.get('seed', doc.get('seed'))}._")


def scale_section(doc: dict[str, Any]) -> list[str]:
    rows = []
    for r in doc["runs"]:
        nodes = str(r.get("nodes", 1))
        if "skipped" in r:
            rows.append([nodes, str(r["n_models"]), "not run", "–", "–", "–", "–", "–", r["skipped"]])
            continue
        if "error" in r:
            rows.append([nodes, str(r["n_models"]), "failed", "–", "–", "–", "–", "–",
                         r["error"][:120].replace("\n", " ")])
            continue
        if r.get("kind") == "select":
            what = (f"select the best of `{r['source']}` within ε = {r['epsilon']}: {r['fraction_cells']:.3f} of "
                    f"{r['n_models'] * r['n_items']:,} cells, {r.get('rounds')} rounds, selected "
                    f"{'within' if r.get('selected_within_epsilon') else 'NOT within'} ε of the exact best")
        else:
            what = f"rank: {r.get('rounds')} rounds, {r.get('n_tie_groups')} tie groups"
        rows.append([nodes, f"{r['n_models']} × {r.get('n_items')}", _f(r["wall_s"], 1),
                     _f(r["share_prefect"], 2, pct=True),
                     _f(r.get("share_storage"), 2, pct=True), _f(r["share_ray"], 2, pct=True),
                     _f(r["share_controller"], 2, pct=True), _f(r.get("in_process_rank_s"), 2),
                     what
                     + ("" if "prefect_server" not in r else
                        ", embedded Prefect server" if r["prefect_server"] == "embedded"
                        else ", `prefect server start` up before timing")])
    runs_meta = {"meta": doc["runs_meta"]} if doc.get("runs_meta") else doc
    out = ["## Scale: ranking openllm_tiny and a 10k × 10k synthetic selection through Prefect + Ray on 2 cores "
           "(1 and 3 Ray nodes)", "",
           _meta_line(runs_meta), "",
           _table(["Ray nodes", "models × items", "flow wall (s)", "Prefect share", "storage share", "Ray share",
                   "controller share", "same ranking in-process (s)", "notes"], rows), ""]
    eps = (doc.get("epsilon_ranking") or {}).get("runs") or []
    if eps:
        erows = []
        for r in eps:
            if "error" in r:
                erows.append([r["source"], "failed", "–", "–", "–", "–", "–", "–",
                              r["error"][:120].replace("\n", " ")])
                continue
            load = r.get("load_avg") or [None]
            erows.append([f"`{r['source']}`", f"{r['n_models']:,} × {r['n_items']:,}", _f(r["wall_s"], 0),
                          _f(load[0], 0), _f(r["cpu_s"], 1), _f(r["peak_rss_gb"], 2), _f(r["cells"], 3),
                          str(r["wrong_listings"]),
                          (f"{r['pairs_opened']:,} of {r['pairs_total']:,} pairs opened" if "pairs_opened" in r
                           else "through `certeval backtest`") + f", {r['tie_groups']:,} tie groups"])
        out += [f"### ε-rankings at leaderboard scale (neighbour construction, ε = {eps[0]['epsilon']}, "
                f"α = {eps[0]['alpha']}, looks of {eps[0]['look']} items)", "", _meta_line(doc), "",
                _table(["source", "models × items", "wall (s)", "load", "CPU (s)", "peak RSS (GB)", "cells",
                        "wrong listings", "notes"], erows),
                "", "Each in a fresh single-threaded process on the shared 2-core machine: wall times at the load "
                "shown are upper bounds, CPU seconds what the run itself cost.", ""]
    return out


# --------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------
