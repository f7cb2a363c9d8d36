"""Fitted factor models on disk: ``.npz`` files (``np.savez``; read with ``allow_pickle=False``, never pickle)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from certeval.errors import InputError
from certeval.estimators.faq.factor_model import FactorModel


def save_factor_model(path: str | Path, model: FactorModel, item_ids: Sequence[str], model_ids: Sequence[str] | None = None) -> None:
    """Write fitted factors and their ids to ``path`` (.npz, no pickle); atomic via a temporary name."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **model.to_arrays(item_ids, model_ids))
    tmp.replace(path)


def load_factor_model(path: str | Path) -> tuple[FactorModel, list[str] | None, list[str] | None]:
    """Read factors written by :func:`save_factor_model` (or the FAQ study's files: model_factors, item_factors)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise InputError(f"factor file {str(path)!r} does not exist") from None
    except (ValueError, OSError) as exc:
        raise InputError(f"factor file {str(path)!r} could not be read: {exc}") from None
    for key in ("model_factors", "item_factors"):
        if key not in arrays:
            raise InputError(f"factor file {str(path)!r} lacks the array {key!r}")
    items = [str(x) for x in arrays["item_ids"]] if "item_ids" in arrays else None
    models = [str(x) for x in arrays["model_ids"]] if "model_ids" in arrays else None
    return FactorModel.from_arrays(arrays), items, models
