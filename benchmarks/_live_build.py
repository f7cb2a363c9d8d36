"""What ``benchmarks/live.py`` runs on: a local lm-eval task built from the trivia bank and noise-perturbed copies
of SmolLM2. Cheap to import (heavy packages are imported inside the functions); tested in tests/test_benchmark_live.py.

* :func:`write_mc_task`: ``N`` four-choice items (:func:`certeval.inputs.trivia.with_choices`, seeded) as JSONL plus an
  lm-eval task YAML (``dataset_path: json``, ``output_type: multiple_choice``, metric ``acc``).
* :func:`write_gen_task`: the same questions as short-answer generation (``generate_until``, ``exact_match``).
* :func:`perturbed_copy`: a model folder whose every weight got seeded Gaussian noise (scaled to the tensor's own
  root mean square), its safetensors files rewritten beside copies of the source's other files (config, tokenizer).
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
    from certeval.inputs.trivia import load_trivia_bank, with_choices

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


def _header(name: str, docs: Path, output_type: str, num_fewshot: int = 0) -> str:
    """A task over a local JSONL file; few-shot examples (if any) from its own split, the doc itself left out."""
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


def write_gen_task(folder: Path, items: list[dict[str, Any]], name: str = GEN_TASK, max_gen_toks: int = 16,
                   num_fewshot: int = 3) -> Path:
    """The short-answer generation task over ``items``: ``num_fewshot`` solved examples, greedy until a newline,
    a filter (whitespace removed, first answer) and ``exact_match`` ignoring case and punctuation."""
    docs = write_docs(folder, items)
    path = folder / f"{name}.yaml"
    path.write_text(_header(name, docs, "generate_until", num_fewshot) + textwrap.dedent(f"""\
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


def perturb(tensors: dict[str, Any], *, scale: float, seed: int) -> dict[str, Any]:
    """``w + scale * rms(w) * N(0, 1)`` for every tensor with more than one element (by name order, seeded; the
    root mean square rather than the standard deviation, so norm weights that are all ones change too)."""
    import numpy as np

    rng = np.random.default_rng(int(seed))
    out = {}
    for name in sorted(tensors):
        w = tensors[name]
        if w.size > 1:
            rms = float(np.sqrt(np.mean(np.square(w, dtype=np.float64))))
            w = (w + rng.standard_normal(w.shape) * (scale * rms)).astype(w.dtype)
        out[name] = w
    return out


def perturbed_copy(source: Path, target: Path, *, scale: float, seed: int) -> Path:
    """``source`` (a transformers model folder of float32/float16 safetensors files) with :func:`perturb` applied to
    every weight, file by file, and the source's other files (config, tokenizer, shard index) copied as they are. No
    torch or transformers import. A folder already holding the same copy is reused."""
    from safetensors.numpy import load_file, save_file

    marker = target / "live-perturbed.json"
    stamp = {"source": str(source), "scale": float(scale), "seed": int(seed), "noise": "gaussian*rms, numpy"}
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return target
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    weights = sorted(source.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{source} holds no .safetensors weights")
    for k, path in enumerate(weights):
        save_file(perturb(load_file(str(path)), scale=scale, seed=int(seed) * 1000 + k), str(target / path.name),
                  metadata={"format": "pt"})
    for extra in sorted(source.iterdir()):
        if extra.is_file() and not extra.name.endswith(WEIGHTS) and extra.name != marker.name:
            shutil.copy2(extra, target / extra.name)
    marker.write_text(json.dumps(stamp))
    return target
