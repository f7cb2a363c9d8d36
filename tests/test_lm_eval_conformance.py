"""Differential conformance, multiple choice: twelve task shapes modelled on lm-eval's most used families, written
as local tasks, run ONCE by real lm-eval (what ``lm_eval run --model hf --log_samples`` runs, on SmolLM2 in
float32) and ONCE by a live ``certeval certify --tasks … --include_path …`` on the same weights
(``hf:bundled:smollm2``, the folder lm-eval is given): every item's acc and acc_norm flags equal lm-eval's samples,
every choice's log-likelihood within 1e-4 nats. A deliberately broken encoder (lm-eval's move of a prompt's trailing
whitespace onto the continuation taken out), run in-process on the same items, must differ from lm-eval on at least
three shapes, and the same in-process host unbroken on none. Shared parts: tests/lm_eval_conformance_support.py."""

from __future__ import annotations

import json

import pytest
from lm_eval_conformance_support import Shape, logliks, mc_differences, offline_vars, run_lm_eval, write_shapes

pytest.importorskip("lm_eval")

pytestmark = pytest.mark.slow

METRICS = {"metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}
CAPITALS = [("Poland", "Warsaw", ["Warsaw", "Krakow", "Gdansk"]), ("France", "Paris", ["Lyon", "Paris", "Nice"]),
            ("Japan", "Tokyo", ["Osaka", "Kyoto", "Tokyo"]), ("Egypt", "Cairo", ["Cairo", "Giza", "Luxor"]),
            ("Peru", "Lima", ["Cusco", "Lima", "Arequipa"])]
SCIENCE = [("Which gas do plants take in from the air?", ["oxygen", "carbon dioxide", "helium", "neon"], 1),
           ("What force pulls objects toward the Earth?", ["magnetism", "friction", "gravity", "wind"], 2),
           ("Which organ pumps blood through the body?", ["the heart", "the lungs", "the liver", "the skin"], 0),
           ("What is frozen water called?", ["steam", "ice", "fog", "sand"], 1),
           ("Which planet is closest to the Sun?", ["Mars", "Venus", "Earth", "Mercury"], 3),
           ("What do bees make?", ["milk", "honey", "silk", "wax paper"], 1)]


def _shapes() -> list[Shape]:
    capitals = [{"country": c, "cities": cities, "label": cities.index(city), "answer": city}
                for c, city, cities in CAPITALS]
    science = [{"question": q, "choices": ch, "label": gold} for q, ch, gold in SCIENCE]
    return [
        # MMLU / ARC-Challenge letters: the options in the prompt, the letters scored
        Shape("cf_letters", [{**d, "options": d["choices"]} for d in science[:5]], {
            "doc_to_text": "{{question}}\nA. {{options[0]}}\nB. {{options[1]}}\nC. {{options[2]}}\nD. {{options[3]}}"
                           "\nAnswer:", "doc_to_choice": ["A", "B", "C", "D"], "doc_to_target": "label", **METRICS}),
        # ARC-Easy texts, the gold through a template (lm-eval reads its digits as an index)
        Shape("cf_arc_texts", science[:5], {"doc_to_text": "Question: {{question}}\nAnswer:",
                                            "doc_to_choice": "choices", "doc_to_target": "{{label}}", **METRICS}),
        # HellaSwag: a sentence to finish, long endings, acc_norm
        Shape("cf_hellaswag", [
            {"ctx": "A man is standing on a ladder next to a house. He", "label": 0, "endings": [
                "paints the wall with long, even strokes of a brush.", "eats a sandwich under the kitchen table.",
                "swims across the pool to the other side quickly.", "plays the violin in a concert hall at night."]},
            {"ctx": "A woman puts flour, eggs and milk in a bowl. She", "label": 2, "endings": [
                "drives the car to the airport in the rain.", "reads a newspaper on the train to work.",
                "stirs the mixture with a whisk until it is smooth.", "climbs a mountain with her friends."]},
            {"ctx": "The children run onto the field with a ball. They", "label": 1, "endings": [
                "sleep in their beds until noon.", "kick the ball to each other and laugh.",
                "write letters to their grandparents.", "cook dinner for the whole family in the oven."]},
            {"ctx": "A dog waits by the door holding a leash in its mouth. The owner", "label": 3, "endings": [
                "turns off the television and goes to bed.", "paints the fence a bright shade of green.",
                "calls the plumber about the leaking sink.", "picks up the leash and takes the dog for a walk."]},
            {"ctx": "Snow falls heavily on the road. The driver", "label": 0, "endings": [
                "slows down and turns on the headlights.", "opens a lemonade stand on the corner.",
                "goes swimming in the warm sea.", "plants tomatoes in the garden."]}],
            {"doc_to_text": "{{ctx}}", "doc_to_choice": "endings", "doc_to_target": "label", **METRICS}),
        # PIQA: a goal, two solutions
        Shape("cf_piqa", [
            {"goal": "To dry wet hands", "sol1": "rub them on a towel.", "sol2": "put them in a bucket of water.",
             "label": 0},
            {"goal": "To keep bread fresh", "sol1": "leave it in the sun.", "sol2": "store it in a sealed bag.",
             "label": 1},
            {"goal": "To cut paper", "sol1": "use scissors.", "sol2": "use a spoon.", "label": 0},
            {"goal": "To see in a dark room", "sol1": "close your eyes.", "sol2": "turn on a lamp.", "label": 1},
            {"goal": "To cool a hot drink", "sol1": "add ice cubes.", "sol2": "put it on the stove.", "label": 0}],
            {"doc_to_text": "Question: {{goal}}\nAnswer:", "doc_to_choice": "{{[sol1, sol2]}}",
             "doc_to_target": "label", **METRICS}),
        # BoolQ: a passage, a question, no / yes
        Shape("cf_boolq", [
            {"passage": "The Nile is a river in Africa.", "question": "is the nile in africa", "label": 1},
            {"passage": "Penguins are birds that cannot fly.", "question": "can penguins fly", "label": 0},
            {"passage": "Water boils at 100 degrees Celsius at sea level.", "question": "does water boil at 100 "
             "degrees", "label": 1},
            {"passage": "The Moon orbits the Earth.", "question": "does the earth orbit the moon", "label": 0},
            {"passage": "Cats are mammals.", "question": "are cats mammals", "label": 1}],
            {"doc_to_text": "{{passage}}\nQuestion: {{question}}?\nAnswer:", "doc_to_choice": ["no", "yes"],
             "doc_to_target": "label", **METRICS}),
        # a prompt ending in " ": lm-eval scores " " + " Warsaw" after "... is"; the gold a choice's text
        Shape("cf_prompt_space", capitals, {"doc_to_text": "The capital city of {{country}} is ",
                                            "doc_to_choice": "cities", "doc_to_target": "answer", **METRICS}),
        # a prompt ending in "\n"
        Shape("cf_prompt_newline", capitals, {"doc_to_text": "Q: What is the capital of {{country}}?\nA:\n",
                                              "doc_to_choice": "cities", "doc_to_target": "label", **METRICS}),
        # target_delimiter "": the choice right after a prompt that ends in a space
        Shape("cf_no_delimiter", [{"a": a, "b": b, "sums": [str(a + b + k) for k in (-1, 0, 1)], "label": 1}
                                  for a, b in ((2, 3), (7, 5), (11, 4), (20, 22), (9, 9))],
              {"doc_to_text": "{{a}} + {{b}} = ", "doc_to_choice": "sums", "doc_to_target": "label",
               "target_delimiter": "", **METRICS}),
        # duplicate choices: the gold may be the second of two equal texts (a tie goes to the first, as in lm-eval)
        Shape("cf_duplicates", [{"country": c, "cities": [city, city, *[x for x in cities if x != city][:1]],
                                 "label": k % 3} for k, (c, city, cities) in enumerate(CAPITALS)],
              {"doc_to_text": "Question: What is the capital of {{country}}?\nAnswer:", "doc_to_choice": "cities",
               "doc_to_target": "label", **METRICS}),
        # choices with a leading space, the gold a text: " Paris" is not "Paris"
        Shape("cf_space_choices", [{"country": c, "cities": [city, " " + city, cities[-1] if cities[-1] != city
                                                              else cities[0]], "answer": (" " + city) if k % 2 else
                                    city} for k, (c, city, cities) in enumerate(CAPITALS)],
              {"doc_to_text": "Question: What is the capital of {{country}}?\nAnswer:", "doc_to_choice": "cities",
               "doc_to_target": "answer", **METRICS}),
        # several gold answers (a list target: lm-eval's multiple_target, right when the prediction is any gold)
        Shape("cf_several_golds", [{"question": q, "choices": ch, "golds": golds} for q, ch, golds in (
            ("Which of these is an even number?", ["2", "3", "4", "5"], [0, 2]),
            ("Which of these is a colour?", ["red", "chair", "blue", "seven"], [0, 2]),
            ("Which of these is a fruit?", ["apple", "brick", "pear", "shoe"], [0, 2]),
            ("Which of these animals can fly?", ["fish", "eagle", "sparrow", "cow"], [1, 2]),
            ("Which of these is a day of the week?", ["Monday", "March", "Friday", "Winter"], [0, 2]))],
            {"doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "choices", "doc_to_target": "golds",
             **METRICS}),
        # 3-shot: three examples of the same split (never the doc itself) before the question
        Shape("cf_three_shot", science, {"doc_to_text": "Question: {{question}}\nAnswer:",
                                         "doc_to_choice": "choices", "doc_to_target": "label", "num_fewshot": 3,
                                         **METRICS}),
    ]


@pytest.fixture(scope="module")
def lm_eval_run(tmp_path_factory):
    """The shapes' tasks and ONE lm-eval run over all of them: (task folder, names, task -> doc_id -> sample,
    datasets' cache folder)."""
    from certeval.inputs.smollm import ensure_converted

    root = tmp_path_factory.mktemp("conformance")
    folder = root / "tasks"
    names = write_shapes(folder, _shapes())
    samples = run_lm_eval(folder, names, str(ensure_converted()), root / "lm", cache=root / "hf_datasets")
    return folder, names, samples, root / "hf_datasets"


def _ours_from_samples(path) -> dict[str, dict[int, dict]]:
    """certeval's samples file as ``task -> doc_id -> {logliks, acc, acc_norm}`` (its item ids are task/doc)."""
    out: dict[str, dict[int, dict]] = {}
    for line in map(json.loads, path.read_text().splitlines()):
        task = line["item_id"].rsplit("/", 1)[0]
        out.setdefault(task, {})[line["doc_id"]] = {"logliks": logliks(line), "acc": line["acc"],
                                                     "acc_norm": line["acc_norm"]}
    return out


def test_a_live_certify_run_scores_every_item_of_every_shape_as_lm_eval_does(lm_eval_run, infra, tmp_path,
                                                                            monkeypatch, capsys):
    from certeval.cli import main

    folder, names, theirs, cache = lm_eval_run
    for key, value in offline_vars(cache).items():
        monkeypatch.setenv(key, value)
    n_docs = sum(len(docs) for docs in theirs.values())
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", ",".join(names), "--include_path", str(folder),
               "--goal", "halfwidth:0.0001", "--batch-size", str(n_docs), "--output", str(tmp_path / "runs"),
               "--run-id", "cf", "--log_samples", "--ray-address", infra])
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    files = sorted((tmp_path / "runs" / "cf" / "samples").rglob("samples_*.jsonl"))
    assert len(files) == 1, files
    ours = _ours_from_samples(files[0])
    differences = {name: mc_differences(theirs[name], ours.get(name, {})) for name in names}
    assert not any(differences.values()), {k: v for k, v in differences.items() if v}
    # the suite can tell: lm-eval's own flags are not all equal (some items right, some wrong), per metric
    flags = [s[m] for docs in theirs.values() for s in docs.values() for m in ("acc", "acc_norm")]
    assert 0 < sum(flags) < len(flags)


def _in_process(host, rows: list[dict]) -> dict[str, dict[int, dict]]:
    """The items scored in this process by an hf host on the same weights (for the broken-encoder check: the live
    run's host is in a Ray actor, out of a monkeypatch's reach): ``task -> doc_id -> {logliks, acc}``."""
    out: dict[str, dict[int, dict]] = {}
    for item, result in zip(rows, host.score(rows)):
        task, doc_id = str(item["item_id"]).rsplit("/", 1)
        out.setdefault(task, {})[int(doc_id)] = {"logliks": [ll for ll, _ in result["resps"]], "acc": result["score"]}
    return out


def test_a_broken_encoder_fails_at_least_three_shapes_and_the_unbroken_one_none(lm_eval_run, tmp_path, monkeypatch):
    from certeval.harnesses.lm_eval_tasks import load_task_items, tasks_bank
    from certeval.hosting import hf
    from certeval.inputs.model_spec import parse_model_spec

    folder, names, theirs, cache = lm_eval_run
    for key, value in offline_vars(cache).items():
        monkeypatch.setenv(key, value)
    rows = load_task_items(tasks_bank(",".join(names), str(folder))).to_dict("records")
    host = hf.build_host(parse_model_spec("hf:bundled:smollm2"))
    right = _in_process(host, rows)
    assert {n: mc_differences(theirs[n], right[n]) for n in names} == {n: [] for n in names}
    monkeypatch.setattr(hf, "whitespace_onto_continuation", lambda context, continuation: (context, continuation))
    broken = _in_process(host, rows)
    failed = sorted(n for n in names if mc_differences(theirs[n], broken[n]))
    assert len(failed) >= 3, failed
    assert {"cf_prompt_space", "cf_prompt_newline", "cf_no_delimiter"} <= set(failed)
