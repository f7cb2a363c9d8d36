"""openai host against a REAL OpenAI-compatible server on loopback: llama-cpp-python serving SmolLM2's GGUF."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from certeval.backends.base import make_host, parse_model_spec
from certeval.estimators._validation import InputError

try:
    import llama_cpp  # noqa: F401

    LLAMA_CPP = None
except ImportError as exc:  # the optional extra certeval[openai]
    LLAMA_CPP = f"llama_cpp is not importable ({exc}); pip install 'llama-cpp-python[server]'"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if LLAMA_CPP:
        pytest.skip(LLAMA_CPP)
    from certeval.backends.smollm import gguf_path

    try:
        gguf = gguf_path()
    except InputError as exc:
        pytest.skip(str(exc))
    port = _free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
         "--n_threads_batch", "1", "--logits_all", "true", "--verbose", "false"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as response:
                json.loads(response.read())
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"llama_cpp.server did not come up (exit {proc.poll()}); see {log.name}")
            time.sleep(0.5)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_generation_on_trivia_items(server):
    host = make_host(f"openai:{server}#smollm2?concurrency=2&max_new_tokens=8")
    items = [
        {"item_id": "t1", "question": "Who painted the ceiling of the Sistine Chapel?", "answers": ["Michelangelo"]},
        {"item_id": "t2", "question": "In 2015 evidence of water was found on which planet?", "answers": ["Mars"]},
        {"item_id": "t3", "question": "Who won the Premier League in 2015?", "answers": ["Chelsea"]},
    ]
    results = host.score(items)
    assert [r["item_id"] for r in results] == ["t1", "t2", "t3"]
    for r in results:
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0 and r["latency_s"] > 0
        assert isinstance(r["output"], str) and "\n" not in r["output"]
    assert results[0]["score"] + results[1]["score"] >= 1, results  # same model as the hf test, Q4_1 kernels


def test_multiple_choice_by_generation_and_by_echo(server):
    items = [{"item_id": "m1", "question": "What is 2 + 2?", "choices": ["4", "9", "17", "31"], "answer": 0},
             {"item_id": "m2", "question": "What is the capital city of France?",
              "choices": ["Tokyo", "Cairo", "Paris", "Lima"], "answer": 2}]
    gen = make_host(f"openai:{server}#smollm2?max_new_tokens=4")
    for r in gen.score(items):
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0
    echo = make_host(f"openai:{server}#smollm2?mc=echo")
    assert echo.describe()["mc"] == "echo"
    lp, tokens = echo.prompt_loglik("Question: What is the capital city of France?\nAnswer:", " Paris")
    assert math.isfinite(lp) and lp < 0 and tokens > 0
    (r,) = echo.score(items[1:])  # one item: echo requests are slow on llama.cpp (logits for every position)
    assert r["score"] in (0.0, 1.0) and r["output"] in items[1]["choices"]


def test_unreachable_endpoint_and_bad_specs_are_input_errors():
    port = _free_port()  # nothing listens there
    with pytest.raises(InputError, match="unreachable"):
        make_host(f"openai:http://127.0.0.1:{port}/v1#m")
    with pytest.raises(InputError, match="needs a model name"):
        parse_model_spec("openai:http://127.0.0.1:1/v1")
    with pytest.raises(InputError, match="http"):
        make_host("openai:ftp://x#m")
    with pytest.raises(InputError, match="mc="):
        make_host(f"openai:http://127.0.0.1:{port}/v1#m?mc=guess")
    with pytest.raises(InputError, match="unknown openai option"):
        make_host(f"openai:http://127.0.0.1:{port}/v1#m?temperature=1")
