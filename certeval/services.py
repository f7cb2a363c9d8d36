"""``certeval up`` / ``certeval down``: a local Ray head and Prefect server that outlive one command.

Every command otherwise starts its own Ray and Prefect's embedded server (about 5 s each on 2 cores, side by
side). ``certeval up`` starts both once, on 127.0.0.1, each in its own session, and writes where they listen
to ``.certeval/services.json`` in the working folder; a later ``certify/compare/rank/select`` run from that
folder with no Ray address and no Prefect configuration of its own (``--ray-address``, ``RAY_ADDRESS``,
``PREFECT_API_URL``, a Prefect profile) connects to them instead, when both still answer. ``certeval down``
stops them and removes the file. They are deliberate long-lived processes: nothing else starts them, and a
command that uses them leaves them running (its own actors still end with it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

FOLDER = ".certeval"
FILE = "services.json"
PROBE_S = 2.0  # each liveness check: a connect and a health request


@dataclass(frozen=True)
class Services:
    """Where ``certeval up``'s services listen, the environment a driver needs for them, their process groups."""

    ray_address: str
    prefect_api_url: str
    env: dict[str, str]
    process_groups: tuple[int, ...]
    folder: str  # .certeval/ of the working folder (the record, Prefect's home)
    ray_dir: str  # Ray's temp dir (its sessions, sockets and logs), removed by certeval down

    def alive(self) -> bool:
        """Every process group exists, Ray's port accepts a connection and Prefect's health endpoint answers."""
        for group in self.process_groups:
            try:
                os.killpg(group, 0)
            except (ProcessLookupError, PermissionError):
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
        os.environ.update(self.env)
        os.environ["PREFECT_API_URL"] = self.prefect_api_url


def services_file(cwd: str | Path | None = None) -> Path:
    return Path(cwd or Path.cwd()) / FOLDER / FILE


def read_services(cwd: str | Path | None = None) -> Services | None:
    """The services ``certeval up`` recorded in this working folder, or None (none, or an unreadable file)."""
    try:
        raw = json.loads(services_file(cwd).read_text())
        return Services(str(raw["ray_address"]), str(raw["prefect_api_url"]), {str(k): str(v) for k, v in
                        raw["env"].items()}, tuple(int(g) for g in raw["process_groups"]), str(raw["folder"]),
                        str(raw["ray_dir"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def start_services(num_cpus: int, cwd: str | Path | None = None, timeout_s: float = 180.0) -> Services:
    """Start a Ray head (``num_cpus`` CPUs) and a Prefect server under ``.certeval/``, record them, return them.
    Each start is bounded by ``timeout_s``; on any failure whatever was started is stopped again."""
    from .backends.local_cluster import LocalPrefectServer, LocalRayCluster

    folder = services_file(cwd).parent
    folder.mkdir(parents=True, exist_ok=True)
    # Ray's sockets live under its temp dir, and a socket path may not exceed 107 bytes: a short folder in /tmp
    ray_dir = tempfile.mkdtemp(prefix="certeval-up-")
    cluster = LocalRayCluster(workers=0, base_dir=ray_dir, cpus_per_node=num_cpus, detached=True)
    prefect = LocalPrefectServer(folder / "prefect")
    from .start_retry import StartError, start_with_retries

    try:
        cluster.start(timeout_s=timeout_s)  # each node: 3 tries (LocalRayCluster._start_with_retry)
        start_with_retries(lambda: prefect.start(timeout_s=timeout_s), what="Prefect's server", tries=2,
                           waits_s=(5.0,), cleanup=prefect.stop, retry_on=(RuntimeError,),
                           hint="the machine may be too busy: retry `certeval up` later")
    except BaseException as exc:
        prefect.stop()
        cluster.stop()
        shutil.rmtree(ray_dir, ignore_errors=True)
        if isinstance(exc, RuntimeError) and str(exc).startswith("ray node"):  # one line, not the node's log
            raise StartError(f"Ray's head did not start in 3 tries (last: {str(exc).splitlines()[0]}); the "
                             "machine may be too busy: retry `certeval up` later") from exc
        raise
    env = {k: v for k, v in cluster.env({}).items()}
    env["PREFECT_HOME"] = prefect.env({})["PREFECT_HOME"]
    services = Services(cluster.address, prefect.api_url, env,
                        (cluster.nodes["head"].proc.pid, prefect.proc.pid), str(folder), ray_dir)
    path = services_file(cwd)
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text(json.dumps(asdict(services), indent=1))
    os.replace(tmp, path)
    return services


def stop_services(services: Services, timeout_s: float = 5.0) -> None:
    """SIGTERM each service's process group, SIGKILL what is left after ``timeout_s``; remove the record."""
    import psutil

    procs, groups = [], []
    for group in services.process_groups:
        try:
            leader = psutil.Process(group)
            if not _started_here(" ".join(leader.cmdline()), services):
                continue  # a stale record: that process id now belongs to another program, which is left alone
            groups.append(group)
            procs.extend([leader, *leader.children(recursive=True)])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, procs = psutil.wait_procs(procs, timeout=timeout_s if sig == signal.SIGTERM else 5.0)
        if not procs:
            break
    if Path(services.ray_dir).name.startswith("certeval-up-"):  # only a folder start_services made
        shutil.rmtree(services.ray_dir, ignore_errors=True)
    try:
        services_file(Path(services.folder).parent).unlink()
    except FileNotFoundError:
        pass


def _started_here(command_line: str, services: Services) -> bool:
    """Whether a process is one ``certeval up`` started for ``services``: the Ray node under its temp dir, or the
    Prefect server on its port."""
    port = services.prefect_api_url.rstrip("/").rsplit(":", 1)[-1].split("/", 1)[0]
    return services.ray_dir in command_line or ("prefect" in command_line and f"--port {port}" in command_line)
