"""openai host against a REAL OpenAI-compatible server on loopback: llama-cpp-python serving SmolLM2's GGUF."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from certeval.backends.base import make_host, parse_model_spec
from certeval.estimators._validation import InputError

try:
    import llama_cpp  # noqa: F401

    LLAMA_CPP = None
except ImportError as exc:  # the optional extra certeval[openai]; scripts/test.sh builds it (docs/backends.md)
    LLAMA_CPP = f"llama_cpp is not importable ({exc}); pip install 'llama-cpp-python[server]'"
    if os.environ.get("CERTEVAL_LLAMA_BUILD_LOG"):  # set by scripts/test.sh when its build failed
        LLAMA_CPP += f"; scripts/test.sh could not build it, see {os.environ['CERTEVAL_LLAMA_BUILD_LOG']}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running ``llama_cpp.server``: its ``/v1`` URL, process and log file."""

    url: str
    proc: subprocess.Popen
    log: Path

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log, errors="replace") as fh:
                return "".join(deque(fh, maxlen=n)).rstrip("\n") or "(empty)"
        except OSError as exc:
            return f"(cannot read {self.log}: {exc})"

    def death(self, what: str, grace: float = 0.0) -> str | None:
        """The failure message if the server process has exited (waiting up to ``grace`` s for it), else None."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        code = self.proc.poll()
        if code is None:
            return None
        if code < 0:
            with contextlib.suppress(ValueError):
                code = f"{code}, {signal.Signals(-code).name}"
        return f"llama_cpp.server died (exit {code}) during {what}; last log lines of {self.log}:\n{self.log_tail()}"

    @contextlib.contextmanager
    def watch(self, what: str):
        """Fail with the server's exit code and log tail, not a client-side error, if it dies during ``what``."""
        try:
            yield self.url
        except Exception:
            # a crashing process may still be on its way out when the client sees the error
            if (message := self.death(what, grace=2.0)) is not None:
                pytest.fail(message, pytrace=False)
            raise
        if (message := self.death(what)) is not None:
            pytest.fail(message, pytrace=False)


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
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
         "--n_threads_batch", "1", "--logits_all", "true", "--verbose", "false"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    srv = Server(f"http://127.0.0.1:{port}/v1", proc, log_path)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{srv.url}/models", timeout=2) as response:
                json.loads(response.read())
            break
        except OSError:
            if (message := srv.death("start-up")) is not None:
                log.close()
                pytest.fail(message, pytrace=False)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                log.close()
                pytest.fail(f"llama_cpp.server did not answer {srv.url}/models within 120 s (killed); last log lines "
                            f"of {log_path}:\n{srv.log_tail()}", pytrace=False)
            time.sleep(0.5)
    yield srv
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_generation_on_trivia_items(server):
    items = [
        {"item_id": "t1", "question": "Who painted the ceiling of the Sistine Chapel?", "answers": ["Michelangelo"]},
        {"item_id": "t2", "question": "In 2015 evidence of water was found on which planet?", "answers": ["Mars"]},
        {"item_id": "t3", "question": "Who won the Premier League in 2015?", "answers": ["Chelsea"]},
    ]
    with server.watch("generation on 3 trivia items (/v1/completions)") as url:
        host = make_host(f"openai:{url}#smollm2?concurrency=2&max_new_tokens=8")
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
    with server.watch("multiple choice by generation") as url:
        gen = make_host(f"openai:{url}#smollm2?max_new_tokens=4")
        gen_results = gen.score(items)
    for r in gen_results:
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0
    with server.watch("multiple choice by echo (prompt log-probs)") as url:
        echo = make_host(f"openai:{url}#smollm2?mc=echo")
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
    for bad in ("timeout=nan", "timeout=inf", "timeout=0", "retries=-1", "retries=two", "concurrency=0"):
        with pytest.raises(InputError, match=bad.split("=")[0]):
            make_host(f"openai:http://127.0.0.1:{port}/v1#m?{bad}")


def test_spec_options_are_percent_decoded_as_in_any_url_query():
    from certeval.backends.base import parse_model_spec
    from certeval.estimators import InputError

    spec = parse_model_spec("openai:http://127.0.0.1:8000/v1#m?api_key_env=MY%5FKEY&scorer=exact%5Fmatch")
    assert spec.location == "http://127.0.0.1:8000/v1" and spec.name == "m"
    assert dict(spec.options) == {"api_key_env": "MY_KEY", "scorer": "exact_match"}
    with pytest.raises(InputError, match="must look like key=value"):
        parse_model_spec("openai:http://127.0.0.1:8000/v1#m?retries")
