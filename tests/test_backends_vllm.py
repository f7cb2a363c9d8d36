"""vLLM host: option parsing everywhere; a real run only where vLLM imports and a CUDA GPU is visible."""

from __future__ import annotations

import importlib.util

import pytest

from certeval.errors import InputError
from certeval.hosting.base import make_host
from certeval.hosting.vllm_host import NOT_INSTALLED, parse_options
from certeval.inputs.model_spec import parse_model_spec


def _vllm_usable() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return "vllm needs a CUDA GPU; none visible"
        from vllm import LLM  # noqa: F401
    except Exception as exc:  # vLLM's own imports fail on CPU-only installs
        return f"vllm does not import here: {type(exc).__name__}: {exc}"
    return None


def test_options_from_spec():
    spec = parse_model_spec("vllm:/models/llama?gpus=2&load_format=dummy&dtype=bfloat16&max_model_len=2048"
                            "&gpu_memory_utilization=0.5&scorer=mc-loglik")
    opts = parse_options(spec)
    assert opts.llm_kwargs() == {"tensor_parallel_size": 2, "load_format": "dummy", "dtype": "bfloat16",
                                 "gpu_memory_utilization": 0.5, "seed": 0, "max_model_len": 2048}
    assert opts.scorer == "mc-loglik"
    assert parse_options(parse_model_spec("vllm:/m")).llm_kwargs()["load_format"] == "auto"
    assert parse_options(parse_model_spec("vllm:/m"), gpus=4).gpus == 4  # kwargs are defaults; the spec wins
    assert parse_options(parse_model_spec("vllm:/m?gpus=1"), gpus=4).gpus == 1


@pytest.mark.parametrize("query, message", [
    ("gpus=0", "gpus"), ("gpus=two", "gpus"), ("gpu_memory_utilization=1.5", "<= 1"),
    ("scorer=bleu", "unknown scorer"), ("tp=2", "unknown vllm option 'tp'"),
])
def test_bad_options_are_input_errors(query, message):
    with pytest.raises(InputError, match=message):
        parse_options(parse_model_spec(f"vllm:/m?{query}"))


@pytest.mark.skipif(_vllm_usable() is None, reason="vLLM is usable here; the not-installed message is not shown")
def test_absent_vllm_is_a_clear_input_error():
    with pytest.raises(InputError) as info:
        make_host("vllm:/models/any?load_format=dummy")
    assert str(info.value) == NOT_INSTALLED


@pytest.mark.gpu
@pytest.mark.skipif(_vllm_usable() is not None, reason=str(_vllm_usable()))
def test_vllm_dummy_weights_scores_items(tmp_path):
    from certeval.inputs.smollm import ensure_converted

    host = make_host(f"vllm:{ensure_converted()}?load_format=dummy&gpu_memory_utilization=0.3&max_model_len=512")
    items = [{"item_id": "a", "question": "2 + 2?", "choices": ["4", "5"], "answer": 0},
             {"item_id": "b", "question": "Capital of France?", "choices": ["Paris", "Rome"], "answer": 0}]
    results = host.score(items)
    assert [r["item_id"] for r in results] == ["a", "b"]
    assert all(r["score"] in (0.0, 1.0) and r["tokens"] > 0 for r in results)
