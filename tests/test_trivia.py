"""The red-trivia bank: shape, determinism, limits, categories, scorer fields."""

from __future__ import annotations

import pytest

from certeval.errors import InputError
from certeval.inputs.banks import bank_from_frame
from certeval.scoring.scorers import resolve_scorer

trivia = pytest.importorskip("certeval.inputs.trivia")


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


def test_spec_string():
    a = trivia.load_trivia_spec("bundled:trivia?categories=general,disney&limit=20&seed=3")
    assert a.equals(trivia.load_trivia_bank(categories=["general", "disney"], limit=20, seed=3))
    with pytest.raises(InputError, match="option"):
        trivia.load_trivia_spec("bundled:trivia?size=3")
    mc = trivia.load_trivia_spec("bundled:trivia?categories=uscapitals&mc=4&seed=1")
    assert mc.equals(trivia.with_choices(trivia.load_trivia_bank(categories=["uscapitals"]), 4, seed=1))
    with pytest.raises(InputError, match="integers"):
        trivia.load_trivia_spec("bundled:trivia?limit=many")


def test_multiple_choice_version():
    from certeval.scoring.scorers import normalize_answer

    frame = trivia.load_trivia_bank(categories=["uscapitals", "general"], limit=200, seed=0)
    mc = trivia.with_choices(frame, n_choices=4, seed=0)
    assert len(mc) >= 190 and mc["item_id"].is_unique
    for row in mc.itertuples():
        assert len(row.choices) == 4 and row.choices[row.answer] == row.answers[0]
        others = [normalize_answer(c) for i, c in enumerate(row.choices) if i != row.answer]
        assert len(set(others)) == 3 and not set(others) & {normalize_answer(a) for a in row.answers}
    positions = mc["answer"].value_counts()
    assert set(positions.index) == {0, 1, 2, 3} and positions.min() > 30  # shuffled, no position bias
    assert resolve_scorer(None, mc.columns).name == "mc-loglik"
    with pytest.raises(InputError, match="n_choices"):
        trivia.with_choices(frame, n_choices=1)


def test_a_run_bank_takes_every_option_the_spec_reader_takes():
    """``--bank bundled:trivia?mc=4`` (docs/backends.md) is the spec reader's multiple-choice bank in a run too;
    the run used to refuse ``mc`` with its own, shorter list of options."""
    from certeval.runs.inputs import load_run_bank

    spec = "bundled:trivia?categories=uscapitals&mc=4&seed=1"
    bank = load_run_bank(spec, ("hf:bundled:smollm2",))
    mc = trivia.load_trivia_spec(spec)
    assert list(bank.item_ids) == list(mc["item_id"]) and {"choices", "answer"} <= set(bank.frame.columns)
    assert resolve_scorer(None, bank.frame.columns).name == "mc-loglik"
    with pytest.raises(InputError, match="n_choices"):
        load_run_bank("bundled:trivia?mc=1", ("hf:bundled:smollm2",))
