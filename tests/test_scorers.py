"""Scorers: answer matching, field checks, custom scorers by import path."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.scoring import scorers as sc


def test_normalize_answer_is_squad_normalisation():
    assert sc.normalize_answer("  The Beatles! ") == "beatles"
    assert sc.normalize_answer("A  Tale of Two   Cities.") == "tale of two cities"
    assert sc.normalize_answer("an apple") == "apple"
    assert sc.normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word


@pytest.mark.parametrize("prediction, aliases, expected", [
    ("the beatles.", ["Beatles"], 1.0),
    ("Paris", ["paris", "Paris, France"], 1.0),
    ("Lyon", ["Paris"], 0.0),
    ("Paris France", ["Paris"], 0.0),  # normalised *equality*, not containment
    ("", ["the"], 0.0),                # an empty answer never matches
    ("Monty Python", ["Monty Python and the Holy Grail", "Monty Python"], 1.0),
])
def test_normalized_match(prediction, aliases, expected):
    assert sc.normalized_match(prediction, aliases) == expected


def test_exact_match_is_case_sensitive_but_strips():
    assert sc.exact_match(" Paris ", ["Paris"]) == 1.0
    assert sc.exact_match("paris", ["Paris"]) == 0.0


def test_parse_numbers():
    assert sc.parse_numbers("It costs 1,234.5 dollars, 3/4 of -2 and 1e3 or .5") == [1234.5, 0.75, -2.0, 1000.0, 0.5]
    assert sc.parse_numbers("no digits here") == []


@pytest.mark.parametrize("prediction, alias, expected", [
    ("The answer is 42", "42", 1.0),
    ("42.00001", "42", 1.0),       # within the relative tolerance 1e-4
    ("42.1", "42", 0.0),
    ("first 3 then 7", "7", 1.0),  # the last number counts (GSM8K-style)
    ("first 3 then 7", "3", 0.0),
    ("1,000", "1000", 1.0),
    ("half: 1/2", "0.5", 1.0),
    ("none", "5", 0.0),
])
def test_numeric_match(prediction, alias, expected):
    assert sc.numeric_match(prediction, [alias]) == expected


def test_extract_answer_takes_first_line_without_prefix():
    assert sc.extract_answer(" Paris\nQ: next question") == "Paris"
    assert sc.extract_answer("\n\nAnswer: 12") == "12"
    assert sc.extract_answer("") == ""


@pytest.mark.parametrize("answer, expected", [(2, 2), (np.int64(1), 1), ("C", 2), ("b", 1), ("blue", 3), ("0", 0)])
def test_answer_index_forms(answer, expected):
    item = {"item_id": "x", "choices": ["red", "green", "yellow", "blue"], "answer": answer}
    assert sc.answer_index(item) == expected


def test_answer_index_out_of_range_is_input_error():
    with pytest.raises(InputError, match="outside its 2 choices"):
        sc.answer_index({"item_id": "x", "choices": ["a", "b"], "answer": 5})


def test_mc_judge_uses_argmax_and_norm_variant_divides_by_length():
    item = {"item_id": "x", "question": "q", "choices": ["a", "much longer choice"], "answer": 1}
    assert sc.judge(sc.get_scorer("mc-loglik"), [-1.0, -2.0], item) == 0.0
    assert sc.judge(sc.get_scorer("mc-loglik"), [-3.0, -2.0], item) == 1.0
    # per-byte: -1/2 = -0.5 vs -2/19 ≈ -0.105 → the long choice wins only after normalisation
    assert sc.judge(sc.get_scorer("mc-loglik-norm"), [-1.0, -2.0], item) == 1.0


def test_generation_judges_use_aliases_and_answer():
    item = {"item_id": "x", "question": "q", "answers": ["Country music", "Country"], "answer": "Country music"}
    assert sc.judge(sc.get_scorer("normalized"), " country\nQ: more", item) == 1.0
    assert sc.judge(sc.get_scorer("exact"), "Country", item) == 1.0
    assert sc.judge(sc.get_scorer("exact"), "country", item) == 0.0
    assert sc.judge(sc.get_scorer("numeric"), "12", {"item_id": "y", "question": "q", "answer": 12}) == 1.0


def test_unknown_scorer_is_input_error():
    with pytest.raises(InputError, match="unknown scorer 'bleu'"):
        sc.get_scorer("bleu")
    with pytest.raises(InputError, match="cannot import module"):
        sc.get_scorer("no_such_module_xyz:f")
    with pytest.raises(InputError, match="has no function"):
        sc.get_scorer("math:no_such_function")


@pytest.mark.parametrize("name, columns, missing", [
    ("mc-loglik", ["item_id", "question", "answer"], "'choices'"),
    ("mc-loglik", ["item_id", "choices", "answer"], "'question' or 'prompt'"),
    ("mc-loglik", ["item_id", "question", "choices"], "'answer'"),
    ("normalized", ["item_id", "question"], "'answers' or 'aliases' or 'answer'"),
    ("numeric", ["item_id", "answer"], "'question' or 'prompt'"),
])
def test_bank_without_needed_field_is_input_error_naming_it(name, columns, missing):
    with pytest.raises(InputError) as info:
        sc.resolve_scorer(name, columns)
    message = str(info.value)
    assert missing in message and name in message and "\n" not in message


def test_auto_scorer_picks_by_fields():
    assert sc.resolve_scorer(None, ["item_id", "question", "choices", "answer"]).name == "mc-loglik"
    assert sc.resolve_scorer("auto", ["item_id", "question", "answers"]).name == "normalized"


def test_custom_scorer_by_import_path(monkeypatch):
    module = types.ModuleType("certeval_test_custom_scorer")

    def contains(prediction, item):
        return float(item["answer"].lower() in prediction.lower())

    def longest(logliks, item):
        return float(int(np.argmax([len(c) for c in item["choices"]])) == item["answer"])

    longest.certeval_kind = "loglik"

    def broken(prediction, item):
        return 2.0

    module.contains, module.longest, module.broken = contains, longest, broken
    monkeypatch.setitem(sys.modules, module.__name__, module)

    gen = sc.get_scorer(f"{module.__name__}:contains")
    assert gen.kind == sc.GENERATE
    assert sc.judge(gen, "I think it is Paris, France", {"item_id": "x", "answer": "paris"}) == 1.0
    mc = sc.get_scorer(f"{module.__name__}:longest")
    assert mc.kind == sc.LOGLIK
    with pytest.raises(InputError, match="'choices'"):
        mc.check_fields(["item_id", "question"])
    with pytest.raises(InputError, match="expected a number in \\[0, 1\\]"):
        sc.judge(sc.get_scorer(f"{module.__name__}:broken"), "x", {"item_id": "x"})


def test_prompts():
    context, conts = sc.mc_request({"item_id": "x", "question": "Is  it?", "choices": ["yes", "no"], "answer": 0})
    assert context == "Question: Is it?\nAnswer:" and conts == [" yes", " no"]
    with pytest.raises(InputError, match="at least 2 choices"):
        sc.mc_request({"item_id": "x", "question": "q", "choices": ["only"], "answer": 0})
    prompt = sc.generation_prompt({"item_id": "x", "question": "Capital of Italy?"})
    assert prompt.startswith(sc.FEWSHOT_QA) and prompt.endswith("Q: Capital of Italy?\nA:")
    assert sc.generation_prompt({"item_id": "x", "prompt": "raw"}) == "raw"
    # Parquet round-trips lists as numpy arrays
    assert sc.answer_aliases({"answers": np.array(["a", "b"]), "answer": "a"}) == ["a", "b"]


def test_the_gold_index_is_used_as_it_is_never_rebuilt_from_text():
    """lm-eval's gold index (``gold``) decides, whatever the choices' texts: the second of two equal choices, a
    space-prefixed choice, several golds (right when the prediction is any of them)."""
    judge = sc.get_scorer("mc-loglik").judge
    assert judge([-1.0, -1.0, -5.0], {"item_id": "x", "choices": ["Rome", "Rome", "Milan"], "gold": [1]}) == 0.0
    assert judge([-5.0, -1.0, -2.0], {"item_id": "x", "choices": ["Paris", " Paris", "Lyon"], "gold": [1]}) == 1.0
    assert judge([-1.0, -5.0, -2.0], {"item_id": "x", "choices": ["Paris", " Paris", "Lyon"], "gold": [1]}) == 0.0
    several = {"item_id": "x", "choices": ["2", "3", "4"], "gold": np.array([0, 2])}  # a Parquet list column
    assert judge([-3.0, -2.0, -1.0], several) == 1.0 and judge([-3.0, -1.0, -2.0], several) == 0.0
    with pytest.raises(InputError, match="gold 3 is not a choice index among its 3 choices"):
        sc.gold_indices({"item_id": "x", "choices": ["a", "b", "c"], "gold": [3]})
    # a bank's own text answer: the exact choice, and a text two choices share names none
    assert sc.answer_index({"item_id": "x", "choices": ["Paris", " Paris", "Lyon"], "answer": " Paris"}) == 1
    with pytest.raises(InputError, match="text of choices \\[0, 1\\]"):
        sc.answer_index({"item_id": "x", "choices": ["Rome", "Rome", "Milan"], "answer": "Rome"})


def test_an_lm_eval_items_continuations_are_its_requests():
    item = {"item_id": "x", "prompt": "2 + 2 = ", "choices": ["4", "5"], "continuations": ["4", "5"], "gold": [0]}
    assert sc.mc_request(item) == ("2 + 2 = ", ["4", "5"])  # target_delimiter "": no space added
    with pytest.raises(InputError, match="at least 2 choices"):
        sc.mc_request({"item_id": "y", "prompt": "q", "choices": ["only"], "gold": [0]})


@pytest.mark.parametrize("item, message", [
    ({"item_id": "q2", "question": "2+2?", "choices": ["4", "5"], "answer": 2}, "answer index 2 is outside its 2"),
    ({"item_id": "q2", "question": "2+2?", "choices": ["4"], "answer": 0}, "needs at least 2 choices, got 1"),
    ({"item_id": "q2", "question": "Capital?", "choices": ["Rome", "Rome"], "answer": "Rome"}, "text of choices"),
])
def test_a_bank_item_without_a_valid_gold_exits_2_before_start_up(tmp_path, capsys, monkeypatch, item, message):
    import json

    from certeval.cli import main

    bank = tmp_path / "bank.jsonl"
    good = {"item_id": "q1", "question": "1+1?", "choices": ["2", "3"], "answer": 0}
    bank.write_text(json.dumps(good) + "\n" + json.dumps(item) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--bank", str(bank), "--scorer", "mc-loglik",
               "--goal", "halfwidth:0.1", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and "'q2'" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and list(work.iterdir()) == []
