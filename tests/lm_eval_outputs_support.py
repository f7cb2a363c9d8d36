"""Local lm-eval tasks of every output type but plain multiple choice, for the conformance tests that run lm-eval
itself: LAMBADA-style ``loglikelihood``, a ``loglikelihood_rolling`` perplexity task, a Winogrande-style
``multiple_input`` task and a GSM8K-style ``generate_until`` task with two filters — offline, over JSONL files the
test writes (``dataset_path: json``)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from lm_eval_support import _header as task_header
from lm_eval_support import write_gen_task

SENTENCES = [
    ("The cat sat on the", "mat"), ("One, two, three, four,", "five"), ("The capital of France is", "Paris"),
    ("Water freezes at zero degrees", "Celsius"), ("She opened the door and walked into the", "room"),
    ("Monday, Tuesday, Wednesday,", "Thursday"), ("He drank a glass of cold", "water"),
    ("The sun rises in the", "east"),
]
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the village.",
    "In 1492, Columbus sailed the ocean blue.\n\nHe had three ships:  the Nina, the Pinta and the Santa Maria.",
    "Café prices rose by 3% — économistes were surprised.",
    "def add(a, b):\n    return a + b\n",
    "Rain, rain, go away; come again another day.",
    "Once upon a time there was a small town by the sea. Every morning the fishermen sailed out before dawn, and "
    "every evening their families waited on the pier to see what the water had given them that day.",
]
WINO = [
    ("The trophy does not fit in the suitcase because the", "trophy", "suitcase", "is too big.", 0),
    ("The man could not lift his son because the", "man", "son", "was so weak.", 0),
    ("Anna did better than Lucy on the test because", "Anna", "Lucy", "had studied hard.", 0),
    ("The ball broke the window because the", "ball", "window", "was fragile.", 1),
    ("The doctor called the nurse because the", "doctor", "nurse", "needed help.", 0),
    ("Paul tried to call George but", "Paul", "George", "was not available.", 1),
]


def _header(name: str, docs: Path, output_type: str) -> str:
    return task_header(name, docs, 0, output_type)


def write_output_tasks(folder: Path) -> dict[str, str]:
    """The four tasks' YAMLs in ``folder`` (one lm-eval --include_path), by task name."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    docs = folder / "lambada.jsonl"  # the gold word follows a space: lm-eval's target_delimiter " "
    docs.write_text("".join(json.dumps({"text": t, "word": w}) + "\n" for t, w in SENTENCES))
    paths["conf_lambada"] = _header("conf_lambada", docs, "loglikelihood") + textwrap.dedent("""\
        doc_to_text: "{{text}}"
        doc_to_target: "{{' ' + word}}"
        target_delimiter: ""
        metric_list:
          - metric: perplexity
            aggregation: perplexity
            higher_is_better: false
          - metric: acc
            aggregation: mean
            higher_is_better: true
        """)
    docs = folder / "ppl.jsonl"
    docs.write_text("".join(json.dumps({"page": t}) + "\n" for t in TEXTS))
    paths["conf_ppl"] = _header("conf_ppl", docs, "loglikelihood_rolling") + textwrap.dedent("""\
        doc_to_text: ""
        doc_to_target: "{{page}}"
        metric_list:
          - metric: word_perplexity
          - metric: byte_perplexity
          - metric: bits_per_byte
        """)
    docs = folder / "wino.jsonl"
    docs.write_text("".join(json.dumps({"start": s, "option1": a, "option2": b, "rest": r, "label": g}) + "\n"
                            for s, a, b, r, g in WINO))
    paths["conf_wino"] = _header("conf_wino", docs, "multiple_choice") + textwrap.dedent("""\
        doc_to_text: "{{label}}"
        doc_to_choice: "{{[start + ' ' + option1, start + ' ' + option2]}}"
        doc_to_target: "{{rest}}"
        metric_list:
          - metric: acc
          - metric: acc_norm
        """)
    out = {}
    for name, text in paths.items():
        path = folder / f"{name}.yaml"
        path.write_text(text)
        out[name] = str(path)
    out["tiny_gen"] = write_gen_task(folder, n_docs=6, num_fewshot=0)
    return out
