"""openai host against REAL OpenAI-compatible servers on loopback.

- ``transformers serve`` (a wheel, installed with the test extras) serving the converted SmolLM2 folder: always
  runs. It has ``/v1/completions`` but no prompt log-probabilities, so it covers generation, multiple choice by
  generation, and the clear error an ``mc=echo`` host gives against a server without ``echo``.
- ``llama_cpp.server`` (llama-cpp-python, which compiles llama.cpp from source): opt-in, marker ``llama_cpp``. It
  runs when llama-cpp-python is installed (``pip install 'llama-cpp-python[server]'``) and is skipped with that
  reason otherwise; it covers ``mc=echo`` (prompt log-probabilities).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from certeval.errors import InputError
from certeval.hosting.base import make_host
from certeval.hosting.openai_host import EndpointError
from certeval.inputs.model_spec import parse_model_spec

TRIVIA = [
    {"item_id": "t1", "question": "Who painted the ceiling of the Sistine Chapel?", "answers": ["Michelangelo"]},
    {"item_id": "t2", "question": "In 2015 evidence of water was found on which planet?", "answers": ["Mars"]},
    {"item_id": "t3", "question": "Who won the Premier League in 2015?", "answers": ["Chelsea"]},
    {"item_id": "t4", "question": "What is the USA state capital of Texas?", "answers": ["Austin"]},
]
MC = [{"item_id": "m1", "question": "What is 2 + 2?", "choices": ["4", "9", "17", "31"], "answer": 0},
      {"item_id": "m2", "question": "What is the capital city of France?",
       "choices": ["Tokyo", "Cairo", "Paris", "Lima"], "answer": 2}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running OpenAI-compatible server: its ``/v1`` URL, process, log file and what it is."""

    name: str
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
        return f"{self.name} died (exit {code}) during {what}; last log lines of {self.log}:\n{self.log_tail()}"

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


@contextlib.contextmanager
def serving(name: str, argv: list[str], port: int, log_dir: Path, env: dict[str, str], wait_s: float = 180.0):
    """Start ``argv``, wait (bounded) until ``/v1/models`` answers anything over HTTP, yield the server, stop it."""
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        srv = Server(name, f"http://127.0.0.1:{port}/v1", proc, log_path)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    with urllib.request.urlopen(f"{srv.url}/models", timeout=5) as response:
                        response.read()
                    break
                except urllib.error.HTTPError:
                    break  # it answers: some servers fail /models (transformers serve scans a hub cache there)
                except OSError:
                    if (message := srv.death("start-up")) is not None:
                        pytest.fail(message, pytrace=False)
                    if time.monotonic() > deadline:
                        pytest.fail(f"{name} did not answer {srv.url}/models within {wait_s:.0f} s (killed); last "
                                    f"log lines of {log_path}:\n{srv.log_tail()}", pytrace=False)
                    time.sleep(0.5)
            yield srv
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


def _offline_env(tmp: Path) -> dict[str, str]:
    hub = tmp / "hub"
    hub.mkdir(exist_ok=True)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------ transformers serve (always)

@pytest.fixture(scope="module")
def smollm_dir():
    pytest.importorskip("gguf")
    from certeval.inputs import smollm

    try:
        return smollm.ensure_converted()
    except InputError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def transformers_server(smollm_dir, tmp_path_factory):
    pytest.importorskip("openai", reason="transformers serve needs the 'openai' package (certeval[test])")
    port = _free_port()
    tmp = tmp_path_factory.mktemp("transformers-serve")
    cli = Path(sys.executable).with_name("transformers")
    argv = [str(cli), "serve", str(smollm_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
            "--dtype", "float32"]
    with serving("transformers serve", argv, port, tmp, _offline_env(tmp)) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf_reference():
    """The same weights in-process, one request per batch (no padding): the reference the server must match."""
    host = make_host("hf:bundled:smollm2?batch=1&max_new_tokens=8&threads=1")
    yield host
    host.close()


@pytest.mark.slow
def test_generation_through_the_server_matches_the_hf_host_item_by_item(transformers_server, smollm_dir,
                                                                         hf_reference):
    spec = f"openai:{transformers_server.url}#{smollm_dir}?concurrency=2&max_new_tokens=8"
    with transformers_server.watch("generation on trivia items (/v1/completions)"):
        results = make_host(spec).score(TRIVIA)
    reference = hf_reference.score(TRIVIA)
    assert [r["item_id"] for r in results] == [item["item_id"] for item in TRIVIA]
    assert [r["output"] for r in results] == [r["output"] for r in reference]
    assert [r["score"] for r in results] == [r["score"] for r in reference]
    for r in results:
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0 and r["latency_s"] > 0
        assert isinstance(r["output"], str) and "\n" not in r["output"]
    # the comparison is not between two empty strings: the model answers at least one question right
    assert sum(r["score"] for r in results) >= 1, results


@pytest.mark.slow
def test_multiple_choice_by_generation_through_the_server(transformers_server, smollm_dir):
    with transformers_server.watch("multiple choice by generation"):
        results = make_host(f"openai:{transformers_server.url}#{smollm_dir}?max_new_tokens=4").score(MC)
    assert [r["item_id"] for r in results] == ["m1", "m2"]
    for r in results:
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0 and isinstance(r["output"], str)


@pytest.mark.slow
def test_echo_against_a_server_without_prompt_logprobs_is_a_clear_error(transformers_server, smollm_dir):
    echo = make_host(f"openai:{transformers_server.url}#{smollm_dir}?mc=echo&retries=0")
    with transformers_server.watch("an echo request"), pytest.raises(EndpointError, match="log-probabilities"):
        echo.prompt_loglik("Question: What is the capital city of France?\nAnswer:", " Paris")


@pytest.mark.slow
def test_a_model_the_server_does_not_serve_is_an_endpoint_error(transformers_server):
    host = make_host(f"openai:{transformers_server.url}#no-such-model?retries=0")
    with transformers_server.watch("a request for another model"), pytest.raises(EndpointError, match="HTTP 4"):
        host.complete("The capital of France is")


# ------------------------------------------------------------------ llama.cpp (opt-in: compiles from source)

try:
    import llama_cpp  # noqa: F401

    LLAMA_CPP = None
except ImportError as exc:
    LLAMA_CPP = (f"opt-in: llama-cpp-python is not installed ({exc}); it compiles llama.cpp from source, so the "
                 "test command does not install it: pip install 'llama-cpp-python[server]' to run this test")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    if LLAMA_CPP:
        pytest.skip(LLAMA_CPP)
    from certeval.inputs.smollm import gguf_path

    try:
        gguf = gguf_path()
    except InputError as exc:
        pytest.skip(str(exc))
    port = _free_port()
    tmp = tmp_path_factory.mktemp("llama")
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
            "--n_threads_batch", "1", "--logits_all", "true", "--verbose", "false"]
    with serving("llama_cpp.server", argv, port, tmp, _offline_env(tmp), wait_s=120.0) as srv:
        yield srv


@pytest.mark.llama_cpp
def test_multiple_choice_by_echo_on_llama_cpp(llama_server):
    with llama_server.watch("multiple choice by echo (prompt log-probs)") as url:
        echo = make_host(f"openai:{url}#smollm2?mc=echo")
        assert echo.describe()["mc"] == "echo"
        lp, tokens = echo.prompt_loglik("Question: What is the capital city of France?\nAnswer:", " Paris")
        assert math.isfinite(lp) and lp < 0 and tokens > 0
        (r,) = echo.score(MC[1:])  # one item: echo requests are slow on llama.cpp (logits for every position)
    assert r["score"] in (0.0, 1.0) and r["output"] in MC[1]["choices"]


# ------------------------------------------------------------------ no server

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
    spec = parse_model_spec("openai:http://127.0.0.1:8000/v1#m?api_key_env=MY%5FKEY&scorer=exact%5Fmatch")
    assert spec.location == "http://127.0.0.1:8000/v1" and spec.name == "m"
    assert dict(spec.options) == {"api_key_env": "MY_KEY", "scorer": "exact_match"}
    with pytest.raises(InputError, match="must look like key=value"):
        parse_model_spec("openai:http://127.0.0.1:8000/v1#m?retries")
