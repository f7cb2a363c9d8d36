"""Records are data (issue 48, class 3): the services record ``certeval up`` writes is checked as data before
``certeval down`` signals anything, and a run takes no environment from it.

Real processes on this machine stand in for ``up``'s services: each a Python process in its own session with the
command line ``up`` would give it (the Ray head names its ``certeval-up-*`` folder, Prefect's server its port) and
a child ``sleep`` in its group; a live service is a loopback TCP listener and a loopback HTTP ``/health``. Every case
asserts its exit code, exactly one line (stderr for a refusal, stdout otherwise), the value echoed, what was
written (a listing of the working folder before and after: a refusal changes nothing) and which processes live
on; at the end of each case every process the test started is gone (asserted, after a last kill).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from surface_table_support import children, listing, no_new_children, run_cli

from certeval.services.up_down import FILE, FOLDER, proc_identity

ROOT = Path(__file__).resolve().parents[1]
LEADER = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"


class Fake:
    """Stand-ins for up's two services, and the record that names them."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.ray_dir = tempfile.mkdtemp(prefix="certeval-up-", dir=os.path.realpath(tempfile.gettempdir()))
        self.port = 1 + int(time.time() * 1000) % 60000
        self.procs: dict[str, subprocess.Popen] = {}
        self.others: list[subprocess.Popen] = []

    def spawn(self, role: str) -> subprocess.Popen:
        args = [sys.executable, "-c", LEADER]
        args += [self.ray_dir] if role == "ray-head" else ["prefect", "server", "start", "--port", str(self.port)]
        proc = subprocess.Popen(args, start_new_session=True)
        self.procs[role] = proc
        _wait_for_child(proc.pid)
        return proc

    def other(self) -> subprocess.Popen:
        """A process of this user that up did not start."""
        proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.others.append(proc)
        _wait_for_exec(proc.pid, "sleep")  # before its exec, /proc shows the forked python's (or no) cmdline
        return proc

    def entry(self, role: str, proc: subprocess.Popen | None = None, **change) -> dict:
        """The record's entry of ``role`` (its process, or ``proc``), with ``change`` applied."""
        proc = proc or self.procs[role]
        ticks, cmdline, _ = proc_identity(proc.pid)
        return {"role": role, "pid": proc.pid, "start_ticks": ticks, "cmdline": list(cmdline), **change}

    def record(self, **change) -> dict:
        out = {"version": 2, "owner_uid": os.getuid(), "state": "up", "ray_address": "127.0.0.1:9",
               "prefect_api_url": f"http://127.0.0.1:{self.port}/api", "ray_dir": self.ray_dir,
               "processes": [self.entry(r) for r in self.procs]}
        out.update(change)
        return out

    def write(self, record, mode: int = 0o600) -> Path:
        folder = self.work / FOLDER
        folder.mkdir(exist_ok=True)
        path = folder / FILE
        path.write_text(record if isinstance(record, str) else json.dumps(record))
        path.chmod(mode)
        return path

    def all_pids(self) -> set[int]:
        pids = set()
        for proc in [*self.procs.values(), *self.others]:
            pids.add(proc.pid)
            try:
                pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return pids

    def cleanup(self) -> None:
        for proc in [*self.procs.values(), *self.others]:
            for pid in _group(proc.pid) | {proc.pid}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.wait(timeout=10)
        import shutil

        shutil.rmtree(self.ray_dir, ignore_errors=True)


def _wait_for_child(pid: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).children():
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)


def _wait_for_exec(pid: int, program: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if cmdline and cmdline[0].decode(errors="replace").endswith(program):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not exec {program} within {timeout_s} s")


def _group(pgid: int) -> set[int]:
    out = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.add(proc.pid)
        except (OSError, psutil.NoSuchProcess):
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    made = Fake(work)
    procs = children()
    try:
        yield made
    finally:
        made.cleanup()
        assert not any(_alive(p) for p in made.all_pids()), "a process was left"
        assert not no_new_children(procs), "a process was left"


def _both(fx: Fake) -> None:
    fx.spawn("ray-head")
    fx.spawn("prefect")


def _sparse(fx: Fake) -> Path:
    path = fx.write("{}")
    with open(path, "r+b") as fh:
        fh.truncate(1 << 30)
    return path


def _linked(fx: Fake) -> Path:
    real = fx.work / "elsewhere.json"
    real.write_text(json.dumps(fx.record()))
    (fx.work / FOLDER).mkdir(exist_ok=True)
    os.symlink(real, fx.work / FOLDER / FILE)
    return fx.work / FOLDER / FILE


# refusals: (case id, set-up writing the record, a word of the line, the value it echoes)
REFUSED = [
    ("not-json", lambda fx: fx.write("{oops"), "not JSON", lambda fx: FILE),
    ("a-list", lambda fx: fx.write("[1, 2]"), "list", lambda fx: FILE),
    ("old-format-with-env", lambda fx: fx.write({"ray_address": "127.0.0.1:9", "prefect_api_url":
                                                 "http://127.0.0.1:9/api", "env": {"PYTHONPATH": str(fx.work)},
                                                 "process_groups": [fx.procs["ray-head"].pid], "folder":
                                                 str(fx.work / FOLDER), "ray_dir": fx.ray_dir}), "version",
     lambda fx: "None"),
    ("env-in-record", lambda fx: fx.write(fx.record(env={"PYTHONPATH": str(fx.work)})), "env", lambda fx: "'env'"),
    ("owner-another-uid", lambda fx: fx.write(fx.record(owner_uid=os.getuid() + 4242)), "owner",
     lambda fx: str(os.getuid() + 4242)),
    ("owner-a-boolean", lambda fx: fx.write(fx.record(owner_uid=True)), "owner", lambda fx: "True"),
    ("record-a-link", _linked, "link", lambda fx: FILE),
    ("record-writable-by-others", lambda fx: fx.write(fx.record(), mode=0o666), "written by others",
     lambda fx: "666"),
    ("record-huge-sparse", _sparse, "declares", lambda fx: str(1 << 30)),
    ("record-a-folder", lambda fx: (fx.work / FOLDER / FILE).mkdir(parents=True), "not a regular file",
     lambda fx: FILE),
    ("ray-dir-root", lambda fx: fx.write(fx.record(ray_dir="/")), "Ray's folder", lambda fx: "'/'"),
    ("ray-dir-climbs-out", lambda fx: fx.write(fx.record(ray_dir=fx.ray_dir + "/../../etc")), "Ray's folder",
     lambda fx: "/../../etc"),
    ("ray-dir-elsewhere", lambda fx: fx.write(fx.record(ray_dir=str(fx.work / "certeval-up-x"))), "Ray's folder",
     lambda fx: "certeval-up-x"),
    ("prefect-not-loopback", lambda fx: fx.write(fx.record(prefect_api_url="http://10.1.2.3:4200/api")), "Prefect",
     lambda fx: "10.1.2.3"),
    ("ray-not-loopback", lambda fx: fx.write(fx.record(ray_address="10.1.2.3:6379")), "Ray", lambda fx: "10.1.2.3"),
    ("pid-a-boolean", lambda fx: fx.write(fx.record(processes=[fx.entry("ray-head", pid=True)])), "process",
     lambda fx: "True"),
    ("pid-one", lambda fx: fx.write(fx.record(processes=[fx.entry("ray-head", pid=1)])), "process",
     lambda fx: "'pid': 1"),
    ("role-unknown", lambda fx: fx.write(fx.record(processes=[{**fx.entry("ray-head"), "role": "shell"}])), "process",
     lambda fx: "shell"),
    ("role-twice", lambda fx: fx.write(fx.record(processes=[fx.entry("ray-head"), fx.entry("ray-head")])), "twice",
     lambda fx: FILE),
    ("state-unknown", lambda fx: fx.write(fx.record(state="maybe")), "state", lambda fx: "maybe"),
]


@pytest.mark.parametrize("case_id,setup,word,echo", REFUSED, ids=[c[0] for c in REFUSED])
def test_down_refuses_a_record_that_is_not_one_and_signals_nothing(case_id, setup, word, echo, fake, capsys):
    _both(fake)
    setup(fake)
    pids, before = fake.all_pids(), listing(fake.work)
    code, lines, out = run_cli(["down"], capsys)
    assert code == 2 and len(lines) == 1 and out == "", (case_id, code, lines, out)
    assert word.lower() in lines[0].lower() and echo(fake) in lines[0], (case_id, lines[0])
    assert "nothing was signalled" in lines[0]
    assert listing(fake.work) == before, f"{case_id}: the record or its folder changed"
    assert all(_alive(p) for p in pids), f"{case_id}: a process was signalled"
    assert os.path.isdir(fake.ray_dir)


# a valid record whose processes are not (or no longer) what up started: left alone, the record removed
def _reused(fx: Fake) -> int:
    other = fx.other()
    fx.write(fx.record(processes=[fx.entry("ray-head", other, cmdline=fx.entry("ray-head")["cmdline"])]))
    return other.pid  # its id, another start time and command line


def _started_later(fx: Fake) -> int:
    other = fx.other()
    fx.write(fx.record(processes=[fx.entry("ray-head", other, start_ticks=fx.entry("ray-head", other)["start_ticks"]
                                           - 1)]))
    return other.pid  # its id and command line, another start time: the id was reused


def _forged(fx: Fake) -> int:
    other = fx.other()
    fx.write(fx.record(processes=[fx.entry("ray-head", other)]))
    return other.pid  # its exact identity, but not the shape of up's Ray head (no certeval-up-* folder)


def _prefect_on_another_port(fx: Fake) -> int:
    fx.write(fx.record(prefect_api_url=f"http://127.0.0.1:{fx.port % 60000 + 1}/api"))
    return fx.procs["prefect"].pid


STALE = [("id-reused-by-another-program", _reused), ("same-id-other-start-time", _started_later),
         ("identity-of-an-unrelated-process", _forged), ("prefect-shape-mismatch", _prefect_on_another_port)]


@pytest.mark.parametrize("case_id,setup", STALE, ids=[c[0] for c in STALE])
def test_down_leaves_alone_what_up_did_not_start(case_id, setup, fake, capsys):
    _both(fake)
    spared = setup(fake)
    group = _group(spared)
    code, lines, out = run_cli(["down"], capsys)
    said = [line for line in out.splitlines() if line.strip()]
    assert code == 0 and lines == [] and len(said) == 1, (case_id, code, lines, out)
    assert "left alone" in said[0] and str(spared) in said[0], (case_id, said[0])
    assert all(_alive(p) for p in group | {spared}), f"{case_id}: a process up did not start was signalled"
    assert not (fake.work / FOLDER / FILE).exists()


def test_down_stops_verified_services_and_their_groups(fake, capsys):
    _both(fake)
    fake.write(fake.record())
    pids = fake.all_pids()
    assert len(pids) == 4  # two leaders, each with a child in its group
    code, lines, out = run_cli(["down"], capsys)
    assert code == 0 and lines == [] and "Ray and Prefect stopped" in out, (lines, out)
    assert not any(_alive(p) for p in pids) and not os.path.exists(fake.ray_dir)
    assert not (fake.work / FOLDER / FILE).exists()


def test_a_group_whose_leader_died_is_stopped_member_by_member(fake, capsys):
    """up killed half-way: the record says 'starting', the Ray head's leader is gone, its child lives on."""
    fake.spawn("ray-head")
    fake.write(fake.record(state="starting"))
    leader = fake.procs["ray-head"]
    member = psutil.Process(leader.pid).children()[0].pid
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait(timeout=10)
    assert _alive(member)
    code, lines, out = run_cli(["down"], capsys)
    assert code == 0 and lines == [] and "stopped" in out, (lines, out)
    assert not _alive(member)


def test_processes_that_already_ended_leave_a_stale_record_removed(fake, capsys):
    _both(fake)
    fake.write(fake.record())
    fake.cleanup()
    code, lines, out = run_cli(["down"], capsys)
    assert code == 0 and lines == [] and "nothing was running" in out, (lines, out)
    assert not (fake.work / FOLDER / FILE).exists()


@pytest.mark.slow  # two CLIs in subprocesses (docs/testing.md)
def test_two_downs_at_once_take_turns(fake):
    _both(fake)
    fake.write(fake.record())
    pids = fake.all_pids()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    downs = [subprocess.Popen([sys.executable, "-m", "certeval", "down"], cwd=fake.work, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [(d.wait(timeout=300), d.stdout.read(), d.stderr.read()) for d in downs]
    for d in downs:
        d.stdout.close()
        d.stderr.close()
    assert [code for code, _, _ in results] == [0, 0], results
    assert all(err.strip() == "" and len(out.strip().splitlines()) == 1 for _, out, err in results), results
    said = sorted(out for _, out, _ in results)
    assert sum("Ray and Prefect stopped" in s for s in said) == 1, said
    assert sum("nothing to stop" in s for s in said) == 1, said
    assert not any(_alive(p) for p in pids)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


def test_a_run_takes_only_derived_settings_from_the_record(fake, monkeypatch, tmp_path):
    """A live record (its processes verified, its ports answering) points a run at the services with settings
    derived from validated fields; a record carrying environment is no record, and nothing planted beside it runs."""
    from argparse import Namespace

    from certeval.cli.pipeline import use_services
    from certeval.services.up_down import read_services

    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fake.port = server.server_address[1]
        _both(fake)
        marker = tmp_path / "MARKER"
        (fake.work / FOLDER).mkdir()
        (fake.work / FOLDER / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        for key in ("RAY_ADDRESS", "PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_HOME", "PREFECT_PROFILES_PATH",
                    "PYTHONPATH"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        ray = f"127.0.0.1:{listener.getsockname()[1]}"
        hostile = fake.record(ray_address=ray, env={"PYTHONPATH": str(fake.work / FOLDER)})
        fake.write(hostile)
        args = Namespace(ray_address=None)
        use_services(args)
        assert read_services() is None and args.ray_address is None and "PYTHONPATH" not in os.environ
        fake.write(fake.record(ray_address=ray))
        with monkeypatch.context() as m:
            for key in ("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                        "RAY_USAGE_STATS_ENABLED", "RAY_DEDUP_LOGS"):
                m.delenv(key, raising=False)
            before = dict(os.environ)
            use_services(args)
            changed = {k for k in os.environ if os.environ.get(k) != before.get(k)}
            assert args.ray_address == ray
            assert changed <= {"RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                               "RAY_USAGE_STATS_ENABLED", "RAY_DEDUP_LOGS", "PREFECT_HOME", "PREFECT_API_URL",
                               "PREFECT_RESULTS_LOCAL_STORAGE_PATH", "PREFECT_SERVER_MEMO_STORE_PATH"}
            assert os.environ["PREFECT_HOME"].startswith(str(fake.work / FOLDER))
            assert os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"].startswith(os.environ["PREFECT_HOME"])
            assert os.environ["RAY_AUTH_TOKEN_PATH"].startswith(fake.ray_dir + "/")
            subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60, cwd=fake.work)
            for key in changed:  # directly: an m.delenv here would be undone by the context, setting them again
                if key in before:
                    os.environ[key] = before[key]
                else:
                    os.environ.pop(key, None)
        assert not marker.exists()
    finally:
        server.shutdown()
        server.server_close()
        listener.close()


def test_down_waits_for_the_runs_using_the_services(fake, capsys):
    """A run using the services is registered under .certeval/users (pid and start time): down refuses in one
    line naming it and signals nothing; a stale registration is dropped; --force stops them anyway."""
    _both(fake)
    fake.write(fake.record())
    user = fake.other()
    ticks = proc_identity(user.pid)[0]
    users = fake.work / FOLDER / "users"
    users.mkdir()
    (users / f"{user.pid}-{ticks}").write_text("")
    (users / f"{user.pid}-{ticks + 1}").write_text("")  # the same id, another start: not a user any more
    pids, before = fake.all_pids(), listing(fake.work / FOLDER / FILE)
    code, lines, out = run_cli(["down"], capsys)
    assert code == 2 and len(lines) == 1 and out == "" and str(user.pid) in lines[0] and "--force" in lines[0], lines
    assert all(_alive(p) for p in pids) and listing(fake.work / FOLDER / FILE) == before
    assert sorted(p.name for p in users.iterdir()) == [f"{user.pid}-{ticks}"]
    code, lines, out = run_cli(["down", "--force"], capsys)
    assert code == 0 and lines == [] and "Ray and Prefect stopped" in out
    assert not any(_alive(p) for p in pids - {user.pid}) and _alive(user.pid)
