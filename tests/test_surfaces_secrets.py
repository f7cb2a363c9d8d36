"""Secrets (issue 48, class 4): an API key reaches the model only: never a file under the run folder, Ray's or
Prefect's folders, the console or a message, including an endpoint's error body that echoes it.

A tiny loopback HTTP server stands in for an OpenAI-compatible endpoint; it echoes the key it is sent (the
``Authorization`` header) in its error bodies, its ``WWW-Authenticate`` header and, when asked, in its completions.
Refusals (a key the endpoint will not take, credentials in a URL, a key pasted into an option): exit 2, one line
naming the variable or flag, the key nowhere, nothing written, no process left. The host itself never lets the key
out of an error or a stored answer. The end-to-end case (slow: a real run with its own Ray and Prefect) fails on a
401 mid-run, exit 3 in one line, and the key is in no file under the working folder, Ray's temporary folder or HOME.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from surface_table_support import assert_refused, children, listing, no_new_children, run_cli

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-live-" + os.urandom(12).hex()
VAR = "ENDPOINT_KEY"  # not a secret-looking name: it is a secret because a spec reads its key from it


class Endpoint(http.server.BaseHTTPRequestHandler):
    mode: dict[str, int | str] = {}

    def _reply(self, code: int, body: dict, echo: str) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("WWW-Authenticate", f"Bearer realm={echo!r}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> None:
        got = self.headers.get("Authorization", "")
        key = self.path.rsplit("/", 1)[-1]
        code = int(self.mode.get(key, 200))
        if code >= 400:
            self._reply(code, {"error": {"message": f"invalid api key: {got} ({got.removeprefix('Bearer ')})"}}, got)
        elif key == "models":
            self._reply(200, {"data": [{"id": "m"}]}, "")
        else:
            text = f" the key is {got.removeprefix('Bearer ')}" if self.mode.get("echo_text") else " Paris"
            self._reply(200, {"choices": [{"text": text}], "usage": {"total_tokens": 3}}, "")

    def do_GET(self):  # noqa: N802
        self._route()

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._route()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("secrets") / "capitals.bank.jsonl"
    path.write_text("".join(json.dumps({"item_id": f"q{i}", "question": f"Capital of France {i}?", "answer": "Paris"})
                            + "\n" for i in range(6)))
    return str(path)


def _spec(url: str, var: str | None = VAR, extra: str = "") -> str:
    return f"openai:{url}#m" + (f"?api_key_env={var}" if var else "") + extra


def _certify(model: str, bank: str, *extra: str) -> list[str]:
    return ["certify", "--model", model, "--bank", bank, "--goal", "halfwidth:0.1", *extra]


# (case id, endpoint answers {path tail: HTTP code}, argv builder, environment, the word the line holds)
CASES = [
    ("models-401-echoing-the-key", {"models": 401}, lambda url, bank: _certify(_spec(url), bank), {VAR: KEY}, VAR),
    ("models-403-echoing-the-key", {"models": 403}, lambda url, bank: _certify(_spec(url), bank), {VAR: KEY}, VAR),
    ("models-401-default-variable", {"models": 401}, lambda url, bank: _certify(_spec(url, None), bank),
     {"OPENAI_API_KEY": KEY}, "OPENAI_API_KEY"),
    ("models-401-no-key-set", {"models": 401}, lambda url, bank: _certify(_spec(url), bank), {}, "not set"),
    ("key-in-the-base-url", {}, lambda url, bank: _certify(_spec(url.replace("http://", f"http://user:{KEY}@")),
                                                          bank), {VAR: KEY}, "api_key_env"),
    ("key-pasted-into-an-option", {}, lambda url, bank: _certify(_spec(url, extra=f"&timeout={KEY}"), bank),
     {VAR: KEY}, "timeout"),
    ("key-as-model-args", {}, lambda url, bank: _certify(_spec(url), bank, "--model_args", f"api_key={KEY}"),
     {VAR: KEY}, "api_key"),
    ("key-in-model-args-bearer", {}, lambda url, bank: _certify(_spec(url), bank, "--model_args",
                                                                f"header=Bearer {KEY}"), {VAR: KEY}, "header"),
]


@pytest.mark.parametrize("case_id,answers,build,env,word", CASES, ids=[c[0] for c in CASES])
def test_a_refusal_never_carries_the_key(case_id, answers, build, env, word, endpoint, bank, tmp_path, monkeypatch,
                                         capsys):
    monkeypatch.chdir(tmp_path)
    for name in (VAR, "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Endpoint, "mode", dict(answers))
    before, procs = listing(tmp_path, Path(bank).parent), children()
    code, lines, out = run_cli([*build(endpoint, bank), "--output", str(tmp_path / "runs")], capsys)
    assert_refused(case_id, code, lines, flag=word)
    assert KEY not in lines[0] and KEY not in out, (case_id, lines[0])
    assert listing(tmp_path, Path(bank).parent) == before, f"{case_id}: something was written"
    assert not no_new_children(procs)


def _host(url: str, **mode):
    from certeval.hosting.base import make_host

    Endpoint.mode = dict(mode)
    return make_host(_spec(url, extra="&retries=1"))


HOST_CASES = [("completions-401-echo", {"completions": 401}), ("completions-500-echo", {"completions": 500}),
              ("completions-429-echo", {"completions": 429})]


@pytest.mark.parametrize("case_id,mode", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_an_endpoint_error_echoing_the_key_never_leaves_the_host_with_it(case_id, mode, endpoint, monkeypatch):
    from certeval.hosting.openai_host import EndpointError

    monkeypatch.setenv(VAR, KEY)
    host = _host(endpoint, **mode)
    try:
        with pytest.raises(EndpointError) as caught:
            host.score([{"item_id": "q0", "question": "Capital of France?", "answer": "Paris"}])
    finally:
        host.close()
        Endpoint.mode = {}
    text = f"{caught.value!r} {caught.value} {caught.value.__cause__!r} {caught.value.__context__!r}"
    assert KEY not in text and str(mode.popitem()[1]) in text, (case_id, text)


def test_a_reply_quoting_the_key_is_judged_but_stored_without_it(endpoint, monkeypatch):
    monkeypatch.setenv(VAR, KEY)
    host = _host(endpoint, echo_text=1)
    try:
        result = host.score([{"item_id": "q0", "question": "What is the key?", "answer": KEY}])[0]
    finally:
        host.close()
        Endpoint.mode = {}
    assert KEY not in json.dumps(result) and "***" in result["output"]


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_401_mid_run_echoing_the_key_leaves_it_nowhere(endpoint, bank, tmp_path):
    """A real run (its own Ray and Prefect's embedded server): /models answers, every completion is a 401 that
    echoes the key. Exit 3 in one line; the key is in no file under the working folder (run folder, ./.prefect),
    Ray's temporary folder or HOME, nor on the console; no process is left."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    short_tmp = tempfile.mkdtemp(prefix="ce48-")  # Ray's socket paths must stay short
    Endpoint.mode = {"completions": 401}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env.update({VAR: KEY, "HOME": str(home), "TMPDIR": short_tmp, "PYTHONPATH": str(ROOT),
                "CUDA_VISIBLE_DEVICES": ""})
    try:
        proc = subprocess.run([sys.executable, "-m", "certeval", *_certify(_spec(endpoint), bank), "--output",
                               str(work / "runs"), "--run-id", "leaky", "--batch-size", "3"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 3 and len(lines) == 1 and "401" in lines[0], proc.stderr[-3000:]
        assert KEY not in proc.stdout + proc.stderr
        assert (work / ".prefect").exists() and (work / "runs" / "leaky").exists()
        needle = KEY.encode()
        assert _files_holding(work, needle) == [] and _files_holding(home, needle) == []
        assert _files_holding(Path(short_tmp), needle) == []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = [p.pid for p in psutil.process_iter(["cmdline"]) if short_tmp in " ".join(p.info["cmdline"] or [])
                    or str(work) in " ".join(p.info["cmdline"] or [])]
            if not left:
                break
            time.sleep(1)
        assert not left, f"processes left: {left}"
    finally:
        Endpoint.mode = {}
        shutil.rmtree(short_tmp, ignore_errors=True)
