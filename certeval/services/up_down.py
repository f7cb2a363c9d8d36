"""``certeval up`` / ``certeval down``: a local Ray head and Prefect server that outlive one command.

Every command otherwise starts its own Ray and Prefect's embedded server (about 5 s each on 2 cores, side by
side). ``certeval up`` starts both once, on 127.0.0.1, each in its own session, and writes where they listen
to ``.certeval/services.json`` in the working folder; a later ``certify/compare/rank/select`` run from that
folder with no Ray address and no Prefect configuration of its own (``--ray-address``, ``RAY_ADDRESS``,
``PREFECT_API_URL``, a Prefect profile) connects to them instead, when both still answer. ``certeval down``
stops them and removes the file. They are deliberate long-lived processes: nothing else starts them, and a
command that uses them leaves them running (its own actors still end with it).

The record is data, never configuration of code (issue 48). It is read only when it is a regular file (not a
link) of this user that nobody else may write, at most 64 KiB of JSON in this version's shape: the owner's uid,
loopback addresses, a Ray folder ``certeval-up-*`` directly in the temporary folder, and each process as pid,
start time (``/proc/<pid>/stat``) and command line. It holds no environment: what a run sets to reach the services
(Ray's token path, Prefect's home and API URL) is derived from the validated fields, so a record cannot set
``PYTHONPATH`` or anything else that changes what Python imports. Before any signal each process is checked
against ``/proc`` (same start time, same command line, this user, the shape of what ``up`` starts); a process
that fails is left alone, and no process group is signalled as a whole: a group's members are signalled one by
one, and only while the group's recorded leader is verified or gone (a pid cannot be reused while its group
lives). ``up`` writes the record as each process starts (``state: starting``), so an ``up`` killed half-way leaves
a record ``down`` can act on; two ``down``\\ s (or an ``up`` and a ``down``) take turns on ``.certeval/services.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certeval.errors import InputError
from certeval.runtime.envsetup import prefect_home_env

FOLDER = ".certeval"
FILE = "services.json"
LOCK = "services.lock"
PROBE_S = 2.0  # each liveness check: a connect and a health request
VERSION = 2
MAX_RECORD_BYTES = 64 << 10
ROLES = ("ray-head", "prefect")
RAY_DIR_PREFIX = "certeval-up-"
LOCK_WAIT_S = 120.0
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
           "RAY_AUTH_MODE": "token"}  # what LocalRayCluster.env sets for drivers, besides the token path
_PREFECT_URL = re.compile(r"^http://127\.0\.0\.1:(\d{1,5})/api$")
_RAY_ADDRESS = re.compile(r"^127\.0\.0\.1:(\d{1,5})$")


@dataclass(frozen=True)
class Proc:
    """One process ``up`` started, identified by more than its id."""

    role: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: clock ticks after boot
    cmdline: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "start_ticks": self.start_ticks, "cmdline": list(self.cmdline)}


def proc_identity(pid: int) -> tuple[int, tuple[str, ...], int] | None:
    """(start ticks, command line, uid) of a live process from /proc, or None when there is none (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        fields = raw.rpartition(")")[2].split()
        if fields[0] == "Z":
            return None
        cmdline = tuple(a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a)
        uid = os.stat(f"/proc/{pid}").st_uid
        return int(fields[19]), cmdline, uid
    except (OSError, IndexError, ValueError):
        return None


def describe_process(role: str, pid: int, wait_s: float = 10.0) -> Proc:
    """A process just started, as the record names it. Popen returns once the child began its exec, which may be
    before the kernel set the new command line: read until it is there and the same twice."""
    deadline, last = time.monotonic() + wait_s, None
    while True:
        ident = proc_identity(pid)
        if ident is None:
            raise RuntimeError(f"process {pid} ({role}) ended as it started")
        if ident[1] and ident == last:
            return Proc(role, pid, ident[0], ident[1])
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} ({role}) shows no command line")
        last = ident
        time.sleep(0.05)


@dataclass(frozen=True)
class Services:
    """Where ``certeval up``'s services listen and which processes are theirs (a validated record)."""

    ray_address: str
    prefect_api_url: str
    processes: tuple[Proc, ...]
    folder: str  # .certeval/ of the working folder (the record, Prefect's home): where the record was read
    ray_dir: str  # Ray's temp dir (its sessions, sockets and logs), removed by certeval down
    owner_uid: int = field(default_factory=os.getuid)
    state: str = "up"

    @property
    def prefect_port(self) -> int:
        return int(_PREFECT_URL.match(self.prefect_api_url).group(1))

    def env(self) -> dict[str, str]:
        """What a driver needs to reach the services, derived from the validated fields (never read from the
        record): Ray's token path under its folder, Prefect's home under the record's folder and its API URL."""
        token = Path(self.ray_dir) / "ray-home" / ".ray" / "auth_token"
        return {**RAY_ENV, "RAY_AUTH_TOKEN_PATH": str(token),
                **prefect_home_env(Path(self.folder) / "prefect" / "prefect-home"),
                "PREFECT_API_URL": self.prefect_api_url}

    def verified(self) -> list[Proc]:
        """The recorded processes that are still the ones ``up`` started (module docstring)."""
        return [p for p in self.processes if self.is_ours(p)]

    def is_ours(self, proc: Proc) -> bool:
        ident = proc_identity(proc.pid)
        if ident is None:
            return False
        ticks, cmdline, uid = ident
        return ticks == proc.start_ticks and cmdline == proc.cmdline and uid == self.owner_uid and \
            _started_here(" ".join(cmdline), self, proc.role)

    def alive(self) -> bool:
        """Both services recorded as up, each process verified, Ray's port accepts a connection and Prefect's
        health endpoint answers."""
        if self.state != "up" or {p.role for p in self.processes} != set(ROLES):
            return False
        if len(self.verified()) != len(self.processes):
            return False
        host, _, port = self.ray_address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_S):
                pass
            with urllib.request.urlopen(f"{self.prefect_api_url}/health", timeout=PROBE_S):
                return True
        except (OSError, ValueError):
            return False

    def apply(self) -> None:
        """Point this process (and the Ray and Prefect clients it will start) at the services."""
        os.environ.update(self.env())

    def record(self) -> dict[str, Any]:
        return {"version": VERSION, "owner_uid": self.owner_uid, "state": self.state, "ray_address": self.ray_address,
                "prefect_api_url": self.prefect_api_url, "ray_dir": self.ray_dir,
                "processes": [p.to_dict() for p in self.processes]}


def shared_ray_address(ray_address: str | None) -> str | None:
    """The Ray a run uses: the one it names, else (with no $RAY_ADDRESS and no Prefect settings of the user's own)
    the services ``certeval up`` started from this working folder when both still answer — their settings applied
    and this process registered as their user, so ``certeval down`` leaves them running meanwhile — else None (the
    run starts its own)."""
    from certeval.runtime.envsetup import user_prefect_configured

    if ray_address or os.environ.get("RAY_ADDRESS") or user_prefect_configured():
        return ray_address
    services = read_services()
    if services is None or not services.alive():
        return None
    services.apply()
    register_user(services)
    return services.ray_address


def services_file(cwd: str | Path | None = None) -> Path:
    return Path(cwd or Path.cwd()) / FOLDER / FILE


USERS = "users"  # .certeval/users/<pid>-<start ticks>: the runs using the services now


def register_user(services: Services) -> Path | None:
    """Record this process as a run using the services (removed at its exit), so ``down`` does not stop them under
    it: a run whose Ray went away mid-round failed instead of finishing or stopping resumably."""
    import atexit

    ident = proc_identity(os.getpid())
    if ident is None:
        return None
    folder = Path(services.folder) / USERS
    try:
        folder.mkdir(exist_ok=True)
        path = folder / f"{os.getpid()}-{ident[0]}"
        path.write_text("")
    except OSError:
        return None
    atexit.register(lambda: path.unlink(missing_ok=True))
    return path


def live_users(services: Services) -> list[int]:
    """The runs using the services now (each checked against /proc: pid and start time); stale entries go."""
    folder = Path(services.folder) / USERS
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    live = []
    for entry in entries:
        pid, _, ticks = entry.name.partition("-")
        ident = proc_identity(int(pid)) if pid.isdigit() and ticks.isdigit() else None
        if ident is not None and ident[0] == int(ticks) and ident[2] == services.owner_uid:
            live.append(int(pid))
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    return sorted(live)


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"services record {str(path)!r} {why}; nothing was signalled (stop what it names yourself, "
                      "then remove it)")


def _check_file(path: Path) -> bytes:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _bad(path, "is a link, not the file certeval up wrote")
    if not stat.S_ISREG(st.st_mode):
        raise _bad(path, "is not a regular file")
    if st.st_uid != os.getuid():
        raise _bad(path, f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise _bad(path, f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})")
    if st.st_size > MAX_RECORD_BYTES:
        raise _bad(path, f"declares {st.st_size} bytes, over the {MAX_RECORD_BYTES} a record is read with")
    try:  # opened as it was checked: a link or pipe swapped in since is refused, never followed or waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _bad(path, "is not a regular file")
        return fh.read(MAX_RECORD_BYTES + 1)


def _port(match: re.Match | None) -> bool:
    return match is not None and 0 < int(match.group(1)) < 65536


def parse_record(raw: bytes, path: Path) -> Services:
    """A record's bytes as :class:`Services`; InputError naming the record and what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _bad(path, "is not JSON") from None
    if not isinstance(data, dict):
        raise _bad(path, f"holds a JSON {type(data).__name__}, not a record")
    if data.get("version") != VERSION:
        raise _bad(path, f"has version {data.get('version')!r}, not {VERSION} (written by another certeval, or not "
                         "by certeval up)")
    extra = sorted(set(data) - {"version", "owner_uid", "state", "ray_address", "prefect_api_url", "ray_dir",
                                "processes"})
    if extra:
        raise _bad(path, f"holds {extra[0]!r}, which certeval up never writes")
    if data.get("owner_uid") != os.getuid() or isinstance(data.get("owner_uid"), bool):
        raise _bad(path, f"names owner uid {data.get('owner_uid')!r}, not you (uid {os.getuid()})")
    if data.get("state") not in ("starting", "up"):
        raise _bad(path, f"has state {data.get('state')!r}")
    ray_address, prefect_url = data.get("ray_address"), data.get("prefect_api_url")
    if not isinstance(ray_address, str) or not _port(_RAY_ADDRESS.match(ray_address)):
        raise _bad(path, f"names Ray at {ray_address!r}, not 127.0.0.1:PORT")
    if not isinstance(prefect_url, str) or not _port(_PREFECT_URL.match(prefect_url)):
        raise _bad(path, f"names Prefect at {prefect_url!r}, not http://127.0.0.1:PORT/api")
    ray_dir = data.get("ray_dir")
    tmp = os.path.realpath(tempfile.gettempdir())
    if not isinstance(ray_dir, str) or os.path.dirname(ray_dir) != tmp or \
            not os.path.basename(ray_dir).startswith(RAY_DIR_PREFIX) or os.path.normpath(ray_dir) != ray_dir:
        raise _bad(path, f"names Ray's folder {ray_dir!r}, not {tmp}/{RAY_DIR_PREFIX}*")
    procs = data.get("processes")
    if not isinstance(procs, list) or len(procs) > len(ROLES):
        raise _bad(path, f"lists processes {procs!r}")
    out = []
    for entry in procs:
        ok = isinstance(entry, dict) and set(entry) == {"role", "pid", "start_ticks", "cmdline"} and \
            entry["role"] in ROLES and all(isinstance(entry[k], int) and not isinstance(entry[k], bool)
                                           for k in ("pid", "start_ticks")) and entry["pid"] > 1 and \
            entry["start_ticks"] >= 0 and isinstance(entry["cmdline"], list) and entry["cmdline"] and \
            all(isinstance(a, str) for a in entry["cmdline"])
        if not ok:
            raise _bad(path, f"lists process {entry!r}, not role/pid/start_ticks/cmdline")
        out.append(Proc(entry["role"], entry["pid"], entry["start_ticks"], tuple(entry["cmdline"])))
    if len({p.role for p in out}) != len(out):
        raise _bad(path, "lists a role twice")
    return Services(ray_address, prefect_url, tuple(out), str(path.parent), ray_dir, data["owner_uid"], data["state"])


def load_services(cwd: str | Path | None = None) -> Services | None:
    """The validated record of this working folder; None when there is none; InputError when it is not one."""
    path = services_file(cwd)
    try:
        raw = _check_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror})") from None
    return parse_record(raw, path)


def read_services(cwd: str | Path | None = None) -> Services | None:
    """The services ``certeval up`` recorded in this working folder, or None (none, or a record that is not a
    valid one: a run then starts its own Ray and Prefect, as without ``up``)."""
    try:
        return load_services(cwd)
    except InputError:
        return None


def write_record(services: Services) -> None:
    """The record, atomically, mode 0600."""
    path = Path(services.folder) / FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", suffix=".tmp", dir=services.folder)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(services.record(), fh, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def record_lock(folder: Path, wait_s: float = LOCK_WAIT_S):
    """``.certeval/services.lock``: one ``up`` or ``down`` at a time in a folder (the others wait their turn)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InputError(f"another certeval up/down holds {str(folder / LOCK)!r}; try again once it "
                                     "ends") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def start_services(num_cpus: int, cwd: str | Path | None = None, timeout_s: float = 180.0) -> Services:
    """Start a Ray head (``num_cpus`` CPUs) and a Prefect server under ``.certeval/``, record them as each starts,
    return them. Each start is bounded by ``timeout_s``; on any failure whatever was started is stopped again and
    the record removed."""
    from .local_cluster import LocalPrefectServer, LocalRayCluster

    folder = services_file(cwd).parent
    folder.mkdir(parents=True, exist_ok=True)
    # Ray's sockets live under its temp dir, and a socket path may not exceed 107 bytes: a short folder in /tmp
    ray_dir = tempfile.mkdtemp(prefix=RAY_DIR_PREFIX, dir=os.path.realpath(tempfile.gettempdir()))
    cluster = LocalRayCluster(workers=0, base_dir=ray_dir, cpus_per_node=num_cpus, detached=True)
    prefect = LocalPrefectServer(folder / "prefect")
    state: dict[str, Any] = {"services": Services(cluster.address, "http://127.0.0.1:1/api", (), str(folder), ray_dir,
                                                  state="starting")}

    def started(role: str, proc) -> None:  # the record follows every start (and every retry's new process)
        current = state["services"]
        kept = tuple(p for p in current.processes if p.role != role)
        url = prefect.api_url if role == "prefect" else current.prefect_api_url
        state["services"] = Services(current.ray_address, url, kept + (describe_process(role, proc.pid),),
                                     current.folder, current.ray_dir, state="starting")
        write_record(state["services"])

    cluster.on_process = lambda name, proc: started("ray-head", proc) if name == "head" else None
    prefect.on_process = lambda proc: started("prefect", proc)
    from certeval.runtime.start_retry import Retries, StartError, start_with_retries

    try:
        cluster.start(timeout_s=timeout_s)  # each node: 3 tries (LocalRayCluster._start_with_retry)
        start_with_retries(lambda: prefect.start(timeout_s=timeout_s), what="Prefect's server",
                           retries=Retries(2, (5.0,), retry_on=(RuntimeError,)), cleanup=prefect.stop,
                           hint="the machine may be too busy: retry `certeval up` later")
    except BaseException as exc:
        prefect.stop()
        cluster.stop()
        shutil.rmtree(ray_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            services_file(cwd).unlink()
        if isinstance(exc, RuntimeError) and str(exc).startswith("ray node"):  # one line, not the node's log
            raise StartError(f"Ray's head did not start in 3 tries (last: {str(exc).splitlines()[0]}); the "
                             "machine may be too busy: retry `certeval up` later") from exc
        raise
    current = state["services"]
    services = Services(current.ray_address, prefect.api_url, current.processes, current.folder, ray_dir, state="up")
    write_record(services)
    return services


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _targets(services: Services, proc: Proc) -> list:
    """The processes to stop for one recorded process: none when its id now belongs to another program; else the
    process, its descendants, and the members of its group (the group is its own: ``up`` starts each service in
    a new session) when the leader is verified or gone (while a group has a member its id is not reused)."""
    import psutil

    ident = proc_identity(proc.pid)
    if ident is not None and not services.is_ours(proc):
        return []  # a stale record: that id belongs to another program now, which is left alone
    found: dict[int, Any] = {}
    if ident is not None:
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(proc.pid)
            found[leader.pid] = leader
            found.update({c.pid: c for c in leader.children(recursive=True) if c.uids().real == services.owner_uid})
    for candidate in psutil.process_iter(["pid", "uids"]):
        if candidate.pid not in found and _pgid(candidate.pid) == proc.pid and \
                candidate.info["uids"] is not None and candidate.info["uids"].real == services.owner_uid:
            found[candidate.pid] = candidate
    return [p for p in found.values() if _running(p)]


def _running(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_services(services: Services, timeout_s: float = 5.0) -> dict[str, list[int]]:
    """SIGTERM each verified service process and its group's members one by one, SIGKILL what is left after
    ``timeout_s``; remove the record and Ray's folder. Returns which pids were stopped and which left alone."""
    import psutil

    procs, left_alone = [], []
    for proc in services.processes:
        targets = _targets(services, proc)
        if not targets and proc_identity(proc.pid) is not None:
            left_alone.append(proc.pid)
        procs.extend(targets)
    stopped = sorted({p.pid for p in procs})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.send_signal(sig)  # psutil checks the process's start time first: a reused id is not hit
        _, procs = psutil.wait_procs(procs, timeout=timeout_s if sig == signal.SIGTERM else 5.0)
        if not procs:
            break
    ray_dir = Path(services.ray_dir)
    if ray_dir.is_dir() and not ray_dir.is_symlink() and ray_dir.stat().st_uid == services.owner_uid:
        shutil.rmtree(ray_dir, ignore_errors=True)  # validated: tmp/certeval-up-*, a folder of this user
    with contextlib.suppress(FileNotFoundError):
        (Path(services.folder) / FILE).unlink()
    return {"stopped": stopped, "left_alone": left_alone}


def _started_here(command_line: str, services: Services, role: str | None = None) -> bool:
    """Whether a process has the shape of what ``certeval up`` starts for ``services``: the Ray node under its
    temp dir, or the Prefect server on its port."""
    ray = services.ray_dir in command_line
    prefect = "prefect" in command_line and f"--port {services.prefect_port}" in command_line
    return {"ray-head": ray, "prefect": prefect}.get(role, ray or prefect)
