"""What ``benchmarks/live.py`` runs on: a local lm-eval task built from the trivia bank and noise-perturbed copies
of SmolLM2. Cheap to import (heavy packages are imported inside the functions); tested in tests/test_benchmark_live.py.

* :func:`write_mc_task`: ``N`` four-choice items (:func:`certeval.trivia.with_choices`, seeded) as JSONL plus an
  lm-eval task YAML (``dataset_path: json``, ``output_type: multiple_choice``, metric ``acc``).
* :func:`write_gen_task`: the same questions as short-answer generation (``generate_until``, ``exact_match``).
* :func:`perturbed_copy`: a model folder whose every weight got seeded Gaussian noise (scaled to the tensor's own
  root mean square), saved with ``save_pretrained`` beside a copy of
  the source's other files (tokenizer, chat template).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

MC_TASK = "live_trivia_mc"
GEN_TASK = "live_trivia_gen"
WEIGHTS = (".safetensors", ".bin", ".ok", ".gguf", ".pt")


def trivia_items(n: int, *, seed: int = 0, n_choices: int = 4) -> list[dict[str, Any]]:
    """``n`` multiple-choice trivia items (question, choices, label = index of the answer, answer, item_id)."""
    from certeval.trivia import load_trivia_bank, with_choices

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    pool = load_trivia_bank()
    take = min(len(pool), int(n * 1.2) + 20)  # with_choices drops items whose category lacks distractors
    while True:
        frame = with_choices(load_trivia_bank(limit=take, seed=seed), n_choices=n_choices, seed=seed, pool=pool)
        if len(frame) >= n or take >= len(pool):
            break
        take = min(len(pool), take * 2)
    if len(frame) < n:
        raise ValueError(f"the trivia bank gives only {len(frame)} {n_choices}-choice items, asked for {n}")
    frame = frame.iloc[:n]
    return [{"question": str(r.question), "choices": [str(c) for c in r.choices], "label": int(r.answer),
             "answer": str(r.choices[int(r.answer)]), "trivia_id": str(r.item_id)}
            for r in frame.itertuples(index=False)]


def _header(name: str, docs: Path, output_type: str) -> str:
    return textwrap.dedent(f"""\
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {docs}
        test_split: test
        num_fewshot: 0
        output_type: {output_type}
        """)


def write_docs(folder: Path, items: list[dict[str, Any]], name: str = "live_trivia.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    docs = folder / name
    docs.write_text("".join(json.dumps(item) + "\n" for item in items))
    return docs


def write_mc_task(folder: Path, items: list[dict[str, Any]], name: str = MC_TASK) -> Path:
    """The multiple-choice task over ``items``: its YAML's path (the JSONL beside it)."""
    docs = write_docs(folder, items)
    path = folder / f"{name}.yaml"
    path.write_text(_header(name, docs, "multiple_choice") + textwrap.dedent("""\
        doc_to_text: "Question: {{question}}\\nAnswer:"
        doc_to_choice: "{{choices}}"
        doc_to_target: label
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
        """))
    return path


def write_gen_task(folder: Path, items: list[dict[str, Any]], name: str = GEN_TASK, max_gen_toks: int = 16) -> Path:
    """The short-answer generation task over ``items`` (greedy until a newline, ``exact_match`` ignoring case)."""
    docs = write_docs(folder, items)
    path = folder / f"{name}.yaml"
    path.write_text(_header(name, docs, "generate_until") + textwrap.dedent(f"""\
        doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
        doc_to_target: "{{{{answer}}}}"
        target_delimiter: " "
        generation_kwargs:
          until: ["\\n", "Question:"]
          max_gen_toks: {max_gen_toks}
          do_sample: false
        filter_list:
          - name: strip
            filter:
              - function: remove_whitespace
              - function: take_first
        metric_list:
          - metric: exact_match
            aggregation: mean
            higher_is_better: true
            ignore_case: true
            ignore_punctuation: true
        """))
    return path


def perturbed_copy(source: Path, target: Path, *, scale: float, seed: int) -> Path:
    """``source`` (a transformers causal-LM folder) with ``w += scale * rms(w) * N(0, 1)`` on every weight tensor
    (seeded), saved to ``target`` with the source's tokenizer files. A folder already holding the same copy is reused."""
    import torch
    from transformers import AutoModelForCausalLM

    marker = target / "live-perturbed.json"
    stamp = {"source": str(source), "scale": float(scale), "seed": int(seed), "noise": "gaussian*rms"}
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return target
    if target.exists():
        shutil.rmtree(target)
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):  # tied weights appear once
            if param.numel() > 1:
                rms = float(param.float().pow(2).mean().sqrt())  # norm weights (all ones at init) have std 0
                param.add_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * (scale * rms))
    model.save_pretrained(str(target))
    for extra in sorted(source.iterdir()):  # the tokenizer and chat template, as they are
        if extra.is_file() and not (target / extra.name).exists() and not extra.name.endswith(WEIGHTS) \
                and ".safetensors" not in extra.name and extra.name != "live-perturbed.json":
            shutil.copy2(extra, target / extra.name)
    marker.write_text(json.dumps(stamp))
    return target
