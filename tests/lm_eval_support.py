"""A local lm-eval task for the tests that run lm-eval itself: offline, a multiple-choice task over a JSONL file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def write_mc_task(folder: Path, *, n_docs: int = 10, num_fewshot: int = 0, gold_cycles: bool = False,
                  metrics: tuple[str, ...] = ("acc",)) -> str:
    """``tiny_mc``: "What is i + 1?" with choices i+1, i+2, i (gold the first, or cycling through the three);
    few-shot examples from its own split. Returns the YAML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "choices": [str(i + 1), str(i + 2), str(i)],
                                        "label": i % 3 if gold_cycles else 0}) + "\n" for i in range(n_docs)))
    metric_list = "".join(f"  - metric: {m}\n" for m in metrics)
    path = folder / "tiny_mc.yaml"
    path.write_text(textwrap.dedent(f"""\
        task: tiny_mc
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {docs}
        test_split: test
        fewshot_split: test
        num_fewshot: {num_fewshot}
        output_type: multiple_choice
        doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: label
        metric_list:
        """) + metric_list)
    return str(path)
