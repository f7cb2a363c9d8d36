"""The red-trivia bank: shape, determinism, limits, categories, scorer fields."""

from __future__ import annotations

import pytest

from certeval.backends.scorers import resolve_scorer
from certeval.banks import bank_from_frame
from certeval.estimators._validation import InputError

trivia = pytest.importorskip("certeval.trivia")


@pytest.fixture(scope="module", autouse=True)
def _needs_package():
    try:
        trivia.lists_dir()
    except InputError as exc:
        pytest.skip(str(exc))


def test_bank_shape_and_fields():
    frame = trivia.load_trivia_bank(categories=["general", "uscapitals"])
    assert list(frame.columns) == ["item_id", "subset", "question", "answers", "answer"]
    assert set(frame["subset"]) == {"general", "uscapitals"}
    assert frame["item_id"].is_unique
    assert (frame["answer"] == frame["answers"].map(lambda a: a[0])).all()
    assert frame["answers"].map(lambda a: len(a) >= 1 and all(isinstance(x, str) for x in a)).all()
    row = frame[frame["question"].str.contains("scoring system of what sport")].iloc[0]
    assert row["answer"] == "Tennis" and row["item_id"].startswith("general/")
    bank = bank_from_frame(frame, "trivia")
    assert bank.n_items == len(frame) and bank.subset_names == ("general", "uscapitals")
    assert resolve_scorer(None, frame.columns).name == "normalized"
    with pytest.raises(InputError, match="'choices'"):
        resolve_scorer("mc-loglik", frame.columns)


def test_picture_questions_are_left_out():
    assert "worldflags" in trivia.categories()
    assert len(trivia.load_trivia_bank(categories="uscapitals,usflags")) == len(
        trivia.load_trivia_bank(categories="uscapitals"))
    assert not trivia.load_trivia_bank(categories=["usflags"]).shape[0]


def test_limit_is_deterministic_and_seeded():
    a = trivia.load_trivia_bank(categories=["general", "disney"], limit=50, seed=3)
    b = trivia.load_trivia_bank(categories=["general", "disney"], limit=50, seed=3)
    c = trivia.load_trivia_bank(categories=["general", "disney"], limit=50, seed=4)
    assert len(a) == 50 and a.equals(b) and set(a["item_id"]) != set(c["item_id"])
    full = trivia.load_trivia_bank(categories=["general", "disney"])
    assert list(a["item_id"]) == [i for i in full["item_id"] if i in set(a["item_id"])]  # canonical order kept
    assert len(trivia.load_trivia_bank(categories=["uscapitals"], limit=10_000)) == len(
        trivia.load_trivia_bank(categories=["uscapitals"]))


@pytest.mark.parametrize("kwargs, message", [
    ({"categories": ["nope"]}, "unknown trivia category 'nope'"),
    ({"categories": []}, "at least one"),
    ({"limit": 0}, "limit"),
    ({"limit": 2.5}, "limit"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(InputError, match=message):
        trivia.load_trivia_bank(**kwargs)
