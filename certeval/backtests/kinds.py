"""The table of backtest cell kinds: what runs the reps of a cell of each kind (:data:`ROWS`), and
:func:`run_chunk`, which the one driver (:func:`certeval.backtests.ray_fanout.run_cells`) calls for every chunk of
reps, in-process or on a Ray worker.

Each row function is pure — ``(data, cell, rep_lo, rep_hi, root_seed) -> rows`` — and lives beside the cell types it
needs, never beside the driver, so the driver can import this table without a cycle:

* ``certify`` — :func:`certeval.backtests.cells.certify_rows`: one model replayed until its goal decides;
* ``paired`` — :func:`certeval.backtests.paired_rows.paired_rows`: one paired run (compare, rank or select);
* ``faq-budget`` — :func:`certeval.backtests.faq_rows.faq_budget_rows`: FAQ beside uniform sampling at fixed budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .cells import CERTIFY, FAQ_BUDGET, PAIRED, Cell, DatasetArrays, certify_rows
from .faq_rows import faq_budget_rows
from .paired_rows import paired_rows

RowFunction = Callable[[DatasetArrays, Cell, int, int, int], list[dict[str, Any]]]
ROWS: dict[str, RowFunction] = {CERTIFY: certify_rows, PAIRED: paired_rows, FAQ_BUDGET: faq_budget_rows}


def run_chunk(data: DatasetArrays, cell: Cell, rep_lo: int, rep_hi: int, root_seed: int,
              record_curve: bool = False, record_errors: bool = False) -> list[dict[str, Any]]:
    """Run reps ``rep_lo..rep_hi-1`` of a cell of any kind; rows are JSON-able dicts (one per rep).

    Each rep's randomness comes from :func:`~certeval.backtests.cells.rep_seed` alone, so a row does not depend on
    the chunk it ran in. ``record_curve`` and ``record_errors`` apply to ``certify`` cells (see
    :func:`~certeval.backtests.cells.certify_rows`).
    """
    if cell.kind == CERTIFY:
        return certify_rows(data, cell, rep_lo, rep_hi, root_seed, record_curve, record_errors)
    return ROWS[cell.kind](data, cell, rep_lo, rep_hi, root_seed)
