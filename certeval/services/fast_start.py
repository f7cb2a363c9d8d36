"""A pipeline command's start-up, overlapped: Prefect's embedded server, Ray and the model actors start together.

Without this module a command runs its phases one after the other: import Prefect, call the
flow (whose client starts Prefect's ephemeral API server in a subprocess and waits for it),
load the bank, then in the ``start-models`` task start Ray and then the actors. On 2 cores
that was 20–30 s before the first model call (``benchmarks/startup.py``).

:func:`prestart`, called by the CLI once every input has been checked and the run folder
claimed, instead

1. launches the embedded Prefect API server (the same ``uvicorn`` app Prefect's ephemeral
   mode runs, on a free 127.0.0.1 port, state in ``PREFECT_HOME``) and points
   ``PREFECT_API_URL`` at it, without waiting and without importing ``prefect.server``
   into the command's own process (a folder's first start begins from a migrated database:
   :mod:`certeval.services.prefect_database`);
2. imports Prefect and the flows in a background thread;
3. starts Ray in the main thread (``init_ray``: loopback only; it needs the main thread,
   where it swaps ``HOME`` and restores the signal handlers), then creates the model actors
   without waiting for them;

and the flow picks all of it up: ``get_client`` finds ``PREFECT_API_URL``, ``init_ray``
finds Ray initialised, ``start-models`` adopts the actors (:func:`take_pool`).

What a user configured is used as it is and never replaced: a Prefect profile or
``PREFECT_API_URL`` (no embedded server is launched), ``--ray-address`` / ``RAY_ADDRESS``
(``init_ray`` connects to it). ``--sequential-start`` (``RuntimeOptions.parallel_start`` false) turns all of
this off (the sequential start-up, kept for ``benchmarks/startup.py``'s before/after comparison).
The embedded server is a child of the command: stopped at exit (``atexit``, after
Prefect's own exit hooks have flushed the run's logs to it) and, after a SIGKILL, by
the watchdog (``certeval.runtime.watchdog``) like Ray's processes.
"""

from __future__ import annotations

import atexit
import http.client
import importlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from certeval.runtime.startup import mark

FLOWS_MODULE = "certeval.flows.pipeline"
_FALSE = ("0", "false", "no", "off")
PREFECT_START_TRIES = 2  # each try waits PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (120 s here)
PREFECT_START_WAITS_S = (5.0,)
_PREPARED: dict[str, Any] = {}  # run id -> ModelPool whose actors are starting (taken by start-models)


class EmbeddedPrefect:
    """Prefect's ephemeral API server (``prefect.server.api.server:create_app`` under uvicorn, UI off), as
    Prefect's own ``SubprocessASGIServer`` runs it, but launched without waiting for it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._attempts = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self, port: int | None = None) -> EmbeddedPrefect:
        """Start the server on ``port`` (a free one by default) and point ``PREFECT_API_URL`` at it."""
        self.port = port or _free_port()
        self._attempts += 1
        spec = importlib.util.find_spec("prefect")  # no import: the command's own Prefect starts later
        app_dir = str(Path(next(iter(spec.submodule_search_locations))).parent)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        os.environ["PREFECT_API_URL"] = self.api_url
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until ``/api/health`` answers 200 (a port taken meanwhile: relaunched on another)."""
        if timeout_s is None:
            try:
                timeout_s = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 120)
            except ValueError:
                timeout_s = 120.0
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll() if self.proc is not None else None
            if code is not None:
                if code == 3 and self._attempts < 5:  # uvicorn: address already in use
                    self.launch()
                    continue
                raise RuntimeError(f"Prefect's embedded API server exited with code {code} while starting")
            try:
                with opener.open(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                # HTTPException: another program took the port before uvicorn bound it and answered in its own
                # protocol (a Ray gRPC port, seen on a busy machine); uvicorn then exits 3 and is relaunched above
                pass
            time.sleep(0.05)
        raise RuntimeError(f"Prefect's embedded API server did not answer within {timeout_s:g} s "
                           "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _settings_files() -> bool:
    """Whether the working folder holds Prefect settings files (``prefect.toml``, ``pyproject.toml``'s
    ``[tool.prefect]``, a ``.env`` naming ``PREFECT_``): they may name a server, so Prefect decides."""
    here = Path.cwd()
    try:
        if (here / "prefect.toml").is_file():
            return True
        pyproject = here / "pyproject.toml"
        if pyproject.is_file() and "[tool.prefect" in pyproject.read_text(errors="replace"):
            return True
        dotenv = here / ".env"
        return dotenv.is_file() and "PREFECT_" in dotenv.read_text(errors="replace")
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prestart:
    """What :func:`prestart` started; :meth:`ready` before the flow, :meth:`close` after it."""

    def __init__(self) -> None:
        self.prefect: EmbeddedPrefect | None = None
        self.run_id: str | None = None
        # a server started on a new, unseeded database: (that database, where its migrated copy is kept)
        self.migrated: tuple[Path, Path] | None = None

    def ready(self) -> None:
        """Wait for the embedded server; one that does not come up in time (or exits) is stopped and started
        once more on the same port (Prefect may have read ``PREFECT_API_URL`` already), then it fails in one
        line (exit 3) naming what to try."""
        if self.prefect is not None:
            from certeval.runtime.start_retry import Retries, start_with_retries

            server = self.prefect
            first = [True]

            def start() -> None:
                if not first[0]:
                    server.launch(server.port)
                first[0] = False
                server.wait_ready()

            start_with_retries(start, what="Prefect's embedded API server", cleanup=server.stop,
                               retries=Retries(PREFECT_START_TRIES, PREFECT_START_WAITS_S, retry_on=(RuntimeError,)),
                               hint="the machine may be too busy: retry, or start Ray and Prefect once with "
                                    "`certeval up` and run from the same folder")
            mark("prefect_ready")
            if self.migrated is not None:  # before the flow writes its first row
                from certeval.services.prefect_database import keep

                keep(*self.migrated)

    def close(self) -> None:
        """Actors the flow did not adopt (e.g. a finished run resumed) are stopped; the server stays up
        until exit, so Prefect's exit hooks can still send it the run's last logs."""
        pool = _PREPARED.pop(self.run_id, None) if self.run_id else None
        if pool is not None:
            pool.shutdown()


def prestart(plan: Any, user_prefect: bool) -> Prestart:
    """Start Prefect's server, Prefect's import, Ray and the actors of ``plan`` together (see the module doc).
    ``user_prefect``: the user configured Prefect (their server is used; none is launched)."""
    out = Prestart()
    if not plan.options.parallel_start:
        return out
    launch = (not user_prefect and "prefect" not in sys.modules and not _settings_files()
              and os.environ.get("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "").strip().lower() not in _FALSE[1:])
    if launch:
        from certeval.services.prefect_database import seed_new_home

        out.migrated = seed_new_home(None, plan.options.cache_path())
        out.prefect = EmbeddedPrefect().launch()
        atexit.register(out.prefect.stop)  # registered before Prefect is imported: runs after its exit hooks
        mark("prefect_launched")
    errors: list[BaseException] = []
    importer = None
    if os.environ.get("PREFECT_HOME"):  # Prefect's settings do not read HOME, which init_ray swaps meanwhile

        def load() -> None:
            try:
                importlib.import_module(FLOWS_MODULE)
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        importer = threading.Thread(target=load, name="certeval-import-flows", daemon=True)
        importer.start()
    else:
        importlib.import_module(FLOWS_MODULE)
    from certeval.hosting.ray_setup import init_ray

    init_ray(plan.ray_address, num_cpus=plan.num_cpus or os.cpu_count() or 2, prestart_workers=False)
    mark("ray_ready")
    out.run_id = plan.run_id
    _PREPARED[plan.run_id] = _launch_pool(plan)
    if importer is not None:
        importer.join()
        if errors:
            raise errors[0]
    mark("flows_imported")
    return out


def _launch_pool(plan: Any) -> Any:
    """The run's actor pool with its actors created (not waited for): what ``start-models`` builds."""
    store = plan.store()
    cache_urls = {label: store.cache(key).folder.url() for label, key in plan.cache_keys().items()}
    return plan_pool(plan, cache_urls).launch()


def plan_pool(plan: Any, cache_urls: dict[str, str]) -> Any:
    """The actor pool a run's plan asks for (not started): its models, their actors and score caches."""
    from certeval.hosting.pool import Actors, ModelPool

    actors = Actors(replicas=plan.replicas, num_gpus=plan.num_gpus, in_flight=plan.in_flight,
                    keep=keeps_actors(plan))
    return ModelPool(dict(zip(plan.labels, plan.models)), actors, cache_urls=cache_urls, options=plan.options,
                     run_id=plan.run_id, host_kwargs={"scorer": plan.scorer} if plan.scorer else None,
                     contents=plan.model_digests())


def keeps_actors(plan: Any) -> bool:
    """``--keep-actors`` where it can work: on a Ray that outlives the command (``certeval up``'s, or
    ``--ray-address``). On the command's own local Ray it is said once on stderr and ignored."""
    if not getattr(plan.options, "keep_actors", False):
        return False
    if plan.ray_address:
        return True
    if not _WARNED:
        _WARNED.append(True)
        print("certeval: --keep-actors: this command's own Ray ends with it, so its actors do too; start Ray once "
              "with `certeval up` (then run from the same folder) or pass --ray-address", file=sys.stderr, flush=True)
    return False


_WARNED: list[bool] = []


def take_pool(plan: Any, cache_urls: dict[str, str]) -> Any:
    """The pool :func:`prestart` launched for this run, if it was built for the same caches; else None."""
    pool = _PREPARED.pop(plan.run_id, None)
    if pool is not None and pool.cache_urls != cache_urls:
        pool.shutdown()
        return None
    return pool
