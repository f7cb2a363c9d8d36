"""Local lm-eval tasks for the tests that run lm-eval itself: offline, a multiple-choice and a generation task over
JSONL files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def _header(name: str, docs: Path, num_fewshot: int, output_type: str) -> str:
    """A task over a local JSONL file whose few-shot examples come from its own (only) split."""
    return textwrap.dedent(f"""\
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {docs}
        test_split: test
        fewshot_split: test
        num_fewshot: {num_fewshot}
        output_type: {output_type}
        """)


def write_mc_task(folder: Path, *, n_docs: int = 10, num_fewshot: int = 0, gold_cycles: bool = False,
                  metrics: tuple[str, ...] = ("acc",), name: str = "tiny_mc", version: str | None = None) -> str:
    """``tiny_mc``: "What is i + 1?" with choices i+1, i+2, i (gold the first, or cycling through the three);
    few-shot examples from its own split; ``version`` as the YAML's ``metadata.version``. Returns the YAML's
    path."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = folder / ("docs.jsonl" if name == "tiny_mc" else f"{name}_docs.jsonl")
    docs.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "choices": [str(i + 1), str(i + 2), str(i)],
                                        "label": i % 3 if gold_cycles else 0}) + "\n" for i in range(n_docs)))
    metric_list = "".join(f"  - metric: {m}\n" for m in metrics)
    path = folder / f"{name}.yaml"
    path.write_text(_header(name, docs, num_fewshot, "multiple_choice") + textwrap.dedent("""\
        doc_to_text: "Question: {{question}}\\nAnswer:"
        doc_to_choice: "{{choices}}"
        doc_to_target: label
        metric_list:
        """) + metric_list + (f"metadata:\n  version: {version}\n" if version is not None else ""))
    return str(path)


def write_gen_task(folder: Path, *, n_docs: int = 12, num_fewshot: int = 2, filters: bool = True) -> str:
    """``tiny_gen``: "What is a + b?" answered by generation until a newline (at most 12 tokens); few-shot examples
    from its own split; two filter pipelines as in lm-eval's arithmetic tasks — ``strict-match`` (the answer must
    be exactly a two-digit number) and ``flexible-extract`` (the first number anywhere) — and ``exact_match``. Sums grow
    with the doc so a small model gets some right and some wrong. Returns the YAML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = folder / "gen_docs.jsonl"
    docs.write_text("".join(json.dumps({"a": 3 + 7 * i, "b": 5 + 11 * i, "answer": str(8 + 18 * i)}) + "\n"
                            for i in range(n_docs)))
    filter_list = textwrap.dedent("""\
        filter_list:
          - name: strict-match
            filter:
              - function: regex
                regex_pattern: "^ ([0-9][0-9])$"
              - function: take_first
          - name: flexible-extract
            filter:
              - function: regex
                regex_pattern: "(-?[0-9]+)"
                group_select: 0
              - function: take_first
        """) if filters else ""
    path = folder / "tiny_gen.yaml"
    path.write_text(_header("tiny_gen", docs, num_fewshot, "generate_until") + textwrap.dedent("""\
        doc_to_text: "Question: What is {{a}} + {{b}}?\\nAnswer:"
        doc_to_target: "{{answer}}"
        target_delimiter: " "
        generation_kwargs:
          until: ["\\n", "Question:"]
          max_gen_toks: 12
          do_sample: false
        metric_list:
          - metric: exact_match
            aggregation: mean
            higher_is_better: true
            ignore_case: true
            ignore_punctuation: false
        """) + filter_list)
    return str(path)
