"""hf host through the backend interface vs bare transformers, same prompts: batched MC log-likelihood.

    python -m benchmarks.gpu [--device cpu|cuda] [--dtype float32|bfloat16] [--model PATH] [--n N] [--batch B]
                             [--items FILE.jsonl] [--random-weights] [--export DIR] [--quick]

Items: multiple-choice questions built from the ``red-trivia`` bank (question, its answer and three
answers drawn from other questions of the same category, seeded), or ``--items`` (JSONL with
item_id, question, choices, answer). Both paths score the SAME (prompt, choice) pairs with the SAME
weights (one model in memory) and batch size:

* host: ``HFHost.score`` in calls of ``--call-size`` items (what a pipeline actor receives); a question's
  context and choices in one packed row (``certeval/hosting/hf_packed.py``), logits only where a continuation
  token is predicted, argmax judged by the ``mc-loglik`` scorer;
* bare: the textbook loop — tokenizer(padding=True) right-padded batches, full-vocabulary
  log-softmax over every position, gather, masked sum.

Reported: items/s, tokens/s (non-pad tokens of all pairs), host/bare ratio, and how often the
two paths pick the same choice. Runs without Ray (GPU machines have torch + transformers only).

GPU machines cannot carry the model weights (98 MB GGUF, 540 MB float32) or the GPL trivia data,
so ``--export DIR`` (run here) writes SmolLM2's config + tokenizer (no weights) and the items to DIR;
on the GPU ``--model DIR/model --random-weights --items DIR/items.jsonl`` benchmarks the same
architecture with random weights: the same FLOPs and memory traffic, meaningless accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._meta import write_result  # noqa: E402
from certeval.hosting.hf import HFHost, HFOptions  # noqa: E402
from certeval.inputs.model_spec import parse_model_spec  # noqa: E402
from certeval.scoring import scorers as sc  # noqa: E402


def trivia_mc_items(n: int, seed: int) -> list[dict[str, Any]]:
    """n four-choice items from the trivia bank (``certeval.inputs.trivia.with_choices``)."""
    from certeval.inputs.trivia import load_trivia_bank, with_choices

    frame = with_choices(load_trivia_bank(limit=n, seed=seed), 4, seed=seed)
    return [{"item_id": r.item_id, "question": r.question, "choices": list(r.choices), "answer": int(r.answer)}
            for r in frame.itertuples()]


def read_items(path: str, n: int) -> list[dict[str, Any]]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()][:n]


def load(model_dir: str, device: str, dtype: str, random_weights: bool, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if random_weights:
        torch.manual_seed(seed)
        config = AutoConfig.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return model.to(device).eval(), tokenizer


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def bare_loglik(model, tokenizer, pairs: list[tuple[str, str]], batch: int, device: str) -> tuple[list[float], int]:
    """Reference path: right padding, full log-softmax, masked sum over continuation tokens."""
    import torch

    out: list[float] = []
    n_tokens = 0
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with torch.inference_mode():
        for start in range(0, len(pairs), batch):
            chunk = pairs[start:start + batch]
            ctx_lens = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c, _ in chunk]
            enc = tokenizer([c + x for c, x in chunk], add_special_tokens=False, padding=True, return_tensors="pt")
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            token_lp = logprobs[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            positions = torch.arange(ids.shape[1] - 1, device=device).unsqueeze(0)
            cont = (positions >= torch.tensor(ctx_lens, device=device).unsqueeze(1) - 1) & (mask[:, 1:] == 1)
            out.extend((token_lp * cont).sum(1).tolist())
            n_tokens += int(mask.sum())
    return out, n_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default)")
    parser.add_argument("--model", default=None, help="local model dir (default: the packaged SmolLM2-135M)")
    parser.add_argument("--random-weights", action="store_true", help="model dir holds config+tokenizer only")
    parser.add_argument("--items", default=None, help="JSONL items (default: trivia multiple choice)")
    parser.add_argument("--n", type=int, default=None, help="items (default 200 cpu, 2000 cuda; --quick 4)")
    parser.add_argument("--batch", type=int, default=None, help="pairs per forward pass (16 cpu, 64 cuda)")
    parser.add_argument("--call-size", type=int, default=64, help="items per host.score call")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats (best kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", default=None, help="write config+tokenizer (no weights) and items to DIR, exit")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    n = args.n or (4 if args.quick else (2000 if cuda else 200))
    batch = args.batch or (64 if cuda else 16)
    if cuda and not torch.cuda.is_available():
        print("--device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2

    model_dir = args.model
    if model_dir is None:
        from certeval.inputs.smollm import ensure_converted

        model_dir = str(ensure_converted())
    items = read_items(args.items, n) if args.items else trivia_mc_items(n, args.seed)

    if args.export:
        from transformers import AutoConfig, AutoTokenizer

        out = Path(args.export)
        (out / "model").mkdir(parents=True, exist_ok=True)
        AutoConfig.from_pretrained(model_dir).save_pretrained(out / "model")
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(out / "model")
        with open(out / "items.jsonl", "w") as handle:
            for item in items:
                handle.write(json.dumps(item) + "\n")
        print(f"wrote {out}/model (config + tokenizer) and {len(items)} items to {out}/items.jsonl")
        return 0

    t0 = time.perf_counter()
    model, tokenizer = load(model_dir, args.device, dtype, args.random_weights, args.seed)
    load_s = time.perf_counter() - t0
    spec = parse_model_spec(f"hf:{model_dir}?device={args.device}&dtype={dtype}&batch={batch}")
    host = HFHost(spec, model, tokenizer, HFOptions(device=args.device, dtype=dtype, batch_size=batch, scorer="mc-loglik"))
    requests = [sc.mc_request(item) for item in items]
    pairs = [(ctx, cont) for ctx, conts in requests for cont in conts]

    # warm-up (CUDA kernels, allocator, tokenizer caches) on a few items, not timed
    host.score(items[: min(4, len(items))])
    bare_loglik(model, tokenizer, pairs[: batch if args.quick else 4 * batch], batch, args.device)

    host_times, bare_times = [], []
    for _ in range(args.repeats):
        _sync(args.device)
        t0 = time.perf_counter()
        results = [r for s in range(0, len(items), args.call_size) for r in host.score(items[s:s + args.call_size])]
        _sync(args.device)
        host_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare, bare_tokens = bare_loglik(model, tokenizer, pairs, batch, args.device)
        _sync(args.device)
        bare_times.append(time.perf_counter() - t0)

    host_tokens = sum(r["tokens"] for r in results)
    bare_pick, pos = [], 0
    for _, conts in requests:
        bare_pick.append(int(np.argmax(bare[pos:pos + len(conts)])))
        pos += len(conts)
    host_pick = [list(map(str, item["choices"])).index(r["output"]) for r, item in zip(results, items)]
    agree = float(np.mean([a == b for a, b in zip(host_pick, bare_pick)]))
    host_s, bare_s = min(host_times), min(bare_times)
    payload = {
        "seed": args.seed,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "versions_extra": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda": torch.version.cuda},
        "model": "SmolLM2-135M-Instruct" + (" (random weights, same architecture)" if args.random_weights else ""),
        "model_dir": model_dir,
        "dtype": dtype,
        "items_source": args.items or "red-trivia via certeval.inputs.trivia.with_choices (4 choices, seeded)",
        "n_items": len(items),
        "n_pairs": len(pairs),
        "batch_pairs": batch,
        "call_size_items": args.call_size,
        "repeats": args.repeats,
        "load_s": load_s,
        "host": {"seconds": host_s, "items_per_s": len(items) / host_s, "tokens": host_tokens,
                 "tokens_per_s": host_tokens / host_s, "accuracy": float(np.mean([r["score"] for r in results]))},
        "bare_transformers": {"seconds": bare_s, "items_per_s": len(items) / bare_s, "tokens": bare_tokens,
                              "tokens_per_s": bare_tokens / bare_s,
                              "accuracy": float(np.mean([p == sc.answer_index(it) for p, it in zip(bare_pick, items)]))},
        "host_over_bare_items_per_s": bare_s / host_s,
        "same_choice_fraction": agree,
    }
    name = "gpu_cuda" if cuda else "gpu_cpu"
    path = write_result(name, payload, args.quick, seed=args.seed)
    print(json.dumps({k: payload[k] for k in ("device_name", "n_items", "host", "bare_transformers",
                                              "host_over_bare_items_per_s", "same_choice_fraction")}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
