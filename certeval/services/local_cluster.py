"""A multi-node Ray cluster on one machine: a head and worker nodes started with ``ray start`` on 127.0.0.1.

Each node is its own ``ray start --block`` process (own session group, own raylet, a distinct custom
resource ``node_<name>``), joined to the head's GCS exactly as nodes of a real cluster are; certeval
connects to it with ``--ray-address`` / ``RAY_ADDRESS`` like to any cluster. Used by the cluster tests
and ``benchmarks/scale.py`` (1 node vs 3 nodes); handy to try a cluster deployment on a laptop::

    with LocalRayCluster(workers=2, base_dir="/tmp/rc") as cluster:
        subprocess.run(["certeval", "rank", "--ray-address", cluster.address, ...], env=cluster.env())
        cluster.kill_node("w1")        # SIGKILL that node's raylet: the node is lost mid-run

Loopback only (docs/environment.md): ``--node-ip-address 127.0.0.1`` (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the
single-node default, would refuse worker nodes; drivers keep it), no usage stats, HOME pointing at a folder with ``ray_bootstrap_config.yaml`` (else Ray probes cloud metadata) and an
auth token pinned by ``RAY_AUTH_TOKEN_PATH`` (Ray 2.60 token auth). Node loss is noticed within about
``health_check_ms × 3`` (Ray's default is 15 s). ``stop`` kills every process the cluster started, by
pid, including the workers of a node whose raylet was killed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from certeval.runtime.envsetup import prefect_home_env, ray_bootstrap_home


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all sockets held until every port is picked: the kernel
    would otherwise hand the same port out twice)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _ray_cli() -> list[str]:
    script = Path(sys.executable).with_name("ray")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class _Node:
    name: str
    proc: subprocess.Popen
    output: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)


class LocalRayCluster:
    """``workers`` worker nodes plus a head, each with ``cpus_per_node`` CPUs, under ``base_dir``."""

    def __init__(self, workers: int = 2, *, base_dir: str | Path, cpus_per_node: int = 1,
                 object_store_mb: int = 100, health_check_ms: int = 500, detached: bool = False) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers!r}")
        self.n_workers = workers
        self.base = Path(base_dir)
        self.cpus = cpus_per_node
        self.object_store_mb = object_store_mb
        self.health_check_ms = health_check_ms
        # detached (certeval up): each node writes to <base>/<name>.log, so it outlives the process that started it
        self.detached = detached
        # head GCS port, then 6 ports per node (agents, metrics, node manager, object manager)
        ports = _free_ports(1 + 6 * (workers + 1))
        self.port = ports[0]
        self._ports = {name: ports[1 + 6 * i: 7 + 6 * i]
                       for i, name in enumerate(["head"] + [f"w{j + 1}" for j in range(workers)])}
        self.nodes: dict[str, _Node] = {}
        self._orphans: set[int] = set()  # processes of killed nodes, reaped at stop
        self.on_process = None  # called with (node name, Popen) as each node's process starts (certeval up's record)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the cluster's processes and for drivers that connect to it."""
        env = dict(os.environ if base is None else base)
        home = ray_bootstrap_home(self.base)
        token = home / ".ray" / "auth_token"
        if not token.exists():
            token.parent.mkdir(parents=True, exist_ok=True)
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
        env.update({
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
        })
        return env

    # -- start --------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> LocalRayCluster:
        try:
            for i, name in enumerate(["head"] + [f"w{j + 1}" for j in range(self.n_workers)]):
                self._start_with_retry(name, head=i == 0, timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_with_retry(self, name: str, *, head: bool, timeout_s: float, attempts: int = 3,
                          waits_s: tuple[float, ...] = (5.0, 15.0)) -> None:
        """One node at a time: ``ray start`` gives a raylet a fixed 30 s to register with the GCS, which a
        loaded 2-core machine can miss (then the node's processes are killed, and after a pause it is started
        again; ray_setup.START_TRIES / START_WAITS_S for a local ``ray.init``)."""
        for attempt in range(attempts):
            self._start_node(name, head=head)
            try:
                self._wait([name], timeout_s)
                return
            except RuntimeError:
                self._kill_node_processes(name)
                if attempt == attempts - 1:
                    raise
                time.sleep(waits_s[min(attempt, len(waits_s) - 1)])

    def _start_node(self, name: str, *, head: bool) -> None:
        env = self.env()
        env["HOME"] = str(ray_bootstrap_home(self.base))  # hides cloud probes while the node starts
        # "0" (our loopback default for a single-node Ray) forbids joining nodes; the nodes still bind
        # 127.0.0.1 only, through --node-ip-address
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
        # how fast the GCS declares a node dead (Ray reads these on the head)
        env.update({"RAY_health_check_period_ms": str(self.health_check_ms),
                    "RAY_health_check_timeout_ms": str(self.health_check_ms),
                    "RAY_health_check_initial_delay_ms": "0", "RAY_health_check_failure_threshold": "3"})
        # as for a local ray.init (ray_setup.SYSTEM_CONFIG): actors at niceness 0, patient registrations;
        # RAY_<key> reaches every process of the node (RayConfig reads it), unless the user set it
        from certeval.hosting.ray_setup import GCS_PORT_WAIT_S, SYSTEM_CONFIG

        for key, value in SYSTEM_CONFIG.items():
            env.setdefault(f"RAY_{key}", str(value))
        env.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_PORT_WAIT_S))
        cmd = _ray_cli() + [
            "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus), "--num-gpus", "0",
            "--resources", json.dumps({f"node_{name}": 1}), "--object-store-memory", str(self.object_store_mb * 2**20),
            "--disable-usage-stats",
        ]
        for flag, port in zip(("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                               "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"),
                              self._ports[name]):
            cmd += [flag, str(port)]
        if head:
            cmd += ["--head", "--port", str(self.port), "--include-dashboard", "false",
                    "--temp-dir", str(self.base / "ray")]
        else:
            cmd += ["--address", self.address]
        if self.detached:
            self.base.mkdir(parents=True, exist_ok=True)
            with open(self.base / f"{name}.log", "w") as log:
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            node = _Node(name, proc)
            threading.Thread(target=self._follow, args=(node, self.base / f"{name}.log"), daemon=True).start()
        else:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            node = _Node(name, proc)
            threading.Thread(target=self._drain, args=(node,), daemon=True).start()
        self.nodes[name] = node
        if self.on_process is not None:
            self.on_process(name, proc)

    @staticmethod
    def _follow(node: _Node, log: Path) -> None:
        """A detached node's log, read until it says the runtime started or the node exits."""
        while node.proc.poll() is None and not node.started.is_set():
            node.output = log.read_text(errors="replace").splitlines()
            if any("Ray runtime started" in line for line in node.output):
                node.started.set()
                return
            time.sleep(0.2)
        node.output = log.read_text(errors="replace").splitlines()

    @staticmethod
    def _drain(node: _Node) -> None:
        for line in node.proc.stdout:
            node.output.append(line.rstrip())
            if "Ray runtime started" in line:
                node.started.set()

    def _wait(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name in names:
            node = self.nodes[name]
            while not node.started.wait(0.2):
                if node.proc.poll() is not None or time.monotonic() > deadline:
                    tail = "\n".join(node.output[-15:])
                    why = f"exited with {node.proc.returncode}" if node.proc.poll() is not None else f"not up in {timeout_s:.0f} s"
                    raise RuntimeError(f"ray node {name!r} {why}:\n{tail}")

    # -- node loss ------------------------------------------------------------
    def processes(self, name: str) -> list:
        """Live processes of node ``name`` (its ``ray start`` process and every descendant)."""
        import psutil

        try:
            root = psutil.Process(self.nodes[name].proc.pid)
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def raylet_pid(self, name: str) -> int:
        for proc in self.processes(name):
            try:
                if proc.name() == "raylet":
                    return int(proc.pid)
            except Exception:  # exited meanwhile
                continue
        raise RuntimeError(f"ray node {name!r} has no raylet process")

    def kill_node(self, name: str) -> int:
        """SIGKILL the raylet of node ``name`` (the node is lost); return the pid killed."""
        procs = self.processes(name)
        self._orphans.update(p.pid for p in procs)
        pid = self.raylet_pid(name)
        os.kill(pid, signal.SIGKILL)
        return pid

    # -- stop ---------------------------------------------------------------
    def stop(self, timeout_s: float = 15.0) -> None:
        """Kill every process of every node (workers first), by pid and by session group."""
        import psutil

        for name in reversed(list(self.nodes)):
            self._kill_node_processes(name, timeout_s)
        for pid in self._orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        psutil.wait_procs([p for p in (self._existing(pid) for pid in self._orphans) if p is not None], timeout=2)
        self._orphans.clear()

    def _kill_node_processes(self, name: str, timeout_s: float = 15.0) -> None:
        import psutil

        node = self.nodes[name]
        pids = {p.pid for p in self.processes(name)}
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)  # start_new_session: the group is the node's own
        except (ProcessLookupError, PermissionError):
            pass
        try:
            node.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs([p for p in (self._existing(pid) for pid in pids) if p is not None], timeout=2)

    @staticmethod
    def _existing(pid: int):
        import psutil

        try:
            return psutil.Process(pid)
        except psutil.NoSuchProcess:
            return None

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LocalPrefectServer:
    """``prefect server start`` on a free 127.0.0.1 port, its own ``PREFECT_HOME`` (a fresh SQLite database),
    the way a team runs a Prefect server; :meth:`env` points drivers at it (``PREFECT_API_URL``). Started once
    and shared by the flow runs, so no run pays for an embedded server's start-up (``benchmarks/scale.py``)."""

    def __init__(self, base_dir: str | Path) -> None:
        self.base_dir = Path(base_dir)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.on_process = None  # called with the server's Popen as it starts (certeval up's record)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.pop("PREFECT_PROFILE", None)
        env.update({"PREFECT_API_URL": self.api_url, **prefect_home_env(self.base_dir / "prefect-home"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"})
        return env

    def start(self, timeout_s: float = 120.0) -> LocalPrefectServer:
        import urllib.request

        self.base_dir.mkdir(parents=True, exist_ok=True)
        # a new home starts from the kept migrated database, if any (a server running Prefect's services never
        # leaves one to keep: certeval.services.prefect_database)
        from certeval.runtime.options import default_cache_dir

        from .prefect_database import seed_new_home

        seed_new_home(self.base_dir / "prefect-home", default_cache_dir())
        self.port = _free_ports(1)[0]
        script = Path(sys.executable).with_name("prefect")
        cli = [str(script)] if script.exists() else [sys.executable, "-m", "prefect"]
        log = open(self.base_dir / "prefect-server.log", "w")
        self.proc = subprocess.Popen([*cli, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if self.on_process is not None:
            self.on_process(self.proc)
        deadline = time.monotonic() + timeout_s
        while True:  # bounded: the health endpoint answers, the process dies, or the deadline passes
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"prefect server did not answer within {timeout_s:g} s; see {log.name}") from None
                time.sleep(0.5)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL, the server's whole session group."""
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(timeout=timeout_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None

    def __enter__(self) -> LocalPrefectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
