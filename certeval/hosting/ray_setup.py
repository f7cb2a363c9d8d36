"""Ray for the model actors: a local Ray on loopback (or a running cluster), and the environment actors get
(forwarded variables, secrets kept out of Ray's runtime_env)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray

from certeval.errors import InputError
from certeval.runtime.envsetup import (
    configure_offline_env,
    private_file_ok,
    private_folder,
    ray_bootstrap_home,
    ray_state_folder,
)
from certeval.runtime.redact import is_secret_name

NAMESPACE = "certeval"
# the user's infrastructure an actor needs from the driver even when Ray was started earlier (e.g. a test
# session); certeval's own settings reach the actors as constructor arguments (RuntimeOptions)
_FORWARDED_ENV_PREFIXES = ("RAY_AUTH_", "AWS_", "HF_", "TRANSFORMERS_", "OPENAI_", "TOKENIZERS_", "CUDA_VISIBLE")
_PRIVATE_ENV_PREFIXES = ("OPENAI_",)


def init_ray(address: str | None = None, *, num_cpus: int = 2, object_store_mb: int = 200,
             state_dir: str | Path | None = None, prestart_workers: bool = True) -> None:
    """Start a local Ray (loopback only) or connect to ``address``; idempotent.

    A local start is tried up to :data:`START_TRIES` times (:func:`start_local_node`: a busy machine), its
    actors at niceness 0 (:data:`SYSTEM_CONFIG`); every try failing raises a one-line ``StartError`` (exit 3).

    HOME points at a folder holding ``ray_bootstrap_config.yaml`` while
    ``ray.init`` runs, or Ray's usage-stats module probes cloud metadata
    (docs/environment.md); workers get the real HOME back through ``runtime_env``.
    """
    if ray.is_initialized():
        return
    configure_offline_env()
    base = Path(state_dir) if state_dir else ray_state_folder()
    real_home = os.environ.get("HOME", str(Path.home()))
    ray_home = ray_bootstrap_home(base)
    _pin_auth_token(ray_home, Path(real_home), local=not address)
    os.environ["HOME"] = str(ray_home)
    # Ray announces on stderr that it enabled token authentication for a new local cluster (its default, and the
    # token certeval pinned above): a second line beside a command's one-line outcome
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    handlers = _signal_handlers()
    try:
        common = dict(namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                      runtime_env={"env_vars": {"HOME": real_home}})
        if address:
            from certeval.runtime.envsetup import check_ray_address

            check_ray_address(address)  # bounded: ray.init alone retries a closed port for minutes
            try:
                ray.init(address=address, **common)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InputError(f"--ray-address {address!r} is unreachable: {str(exc).splitlines()[0]}") from None
        else:
            # prestart_workers=False: no idle task workers started for the driver; model actors never use them
            # (each starts its own worker) and on 2 cores their imports delay the start-up (benchmarks/startup.py)
            system_config = local_system_config()
            if not prestart_workers:
                system_config["prestart_worker_first_driver"] = False

            def start() -> None:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         object_store_memory=object_store_mb * 2**20, _system_config=dict(system_config), **common)

            start_local_node(start)
    finally:
        os.environ["HOME"] = real_home
        _restore_signal_handlers(handlers)


# A local node's start on a busy machine (docs/robustness.md, "Start-up on a busy machine"). Ray gives the raylet
# a fixed 30 s to register with the GCS (a literal in ray/_private/node.py); what Ray lets us raise, we raise:
START_TRIES = 3  # whole node starts, the failed one's processes ended before the next
START_WAITS_S = (5.0, 15.0)  # pause before the 2nd and the 3rd try
GCS_PORT_WAIT_S = 120  # RAY_gcs_server_port_wait_time_s (Ray's default 30): the GCS up and answering
# RayConfig keys (_system_config) for a node certeval starts: model actors at the user's priority (Ray's default
# worker_niceness is 15: on a shared machine inference would yield to everything else), and a worker process
# (an actor's host) may take 5 minutes, not 60 s, to register with its raylet
SYSTEM_CONFIG = {"worker_niceness": 0, "worker_register_timeout_seconds": 300}
START_HINT = ("the machine may be too busy: retry, or start Ray and Prefect once with `certeval up` and run "
              "from the same folder")


def local_system_config() -> dict[str, Any]:
    """:data:`SYSTEM_CONFIG` less the keys the user set as ``RAY_<key>`` (theirs win)."""
    return {k: v for k, v in SYSTEM_CONFIG.items() if f"RAY_{k}" not in os.environ}


def start_local_node(start: Any, *, tries: int | None = None, waits_s: Any = None) -> None:
    """``start()`` (a ``ray.init`` of a new local node) with :func:`certeval.runtime.start_retry.start_with_retries`:
    after a failed try the Ray processes it started are ended (no orphans) before the next one.
    ``RAY_gcs_server_port_wait_time_s`` is raised to :data:`GCS_PORT_WAIT_S` meanwhile unless the user set it."""
    from certeval.runtime.start_retry import Retries, start_with_retries

    before = _child_pids()
    own_wait = "RAY_gcs_server_port_wait_time_s" not in os.environ
    if own_wait:
        os.environ["RAY_gcs_server_port_wait_time_s"] = str(GCS_PORT_WAIT_S)
    try:
        retries = Retries(START_TRIES if tries is None else tries, START_WAITS_S if waits_s is None else waits_s,
                          never_retry=(TypeError, ValueError))  # ray.init's own argument checks
        start_with_retries(start, what="Ray's local node", hint=START_HINT, retries=retries,
                           cleanup=lambda: end_failed_node(before))
    finally:
        if own_wait:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)


def _child_pids() -> set[tuple[int, float]]:
    """This process's direct children, as (pid, start time)."""
    import psutil

    out = set()
    for child in psutil.Process().children():
        try:
            out.add((child.pid, child.create_time()))
        except psutil.Error:
            continue
    return out


def _is_ray_process(proc: Any) -> bool:
    try:
        if proc.name() in ("raylet", "gcs_server"):
            return True
        line = " ".join(proc.cmdline())
    except Exception:  # psutil.Error: gone meanwhile
        return False
    return "/ray/" in line or line.startswith("ray::")


def failed_node_processes(before: set[tuple[int, float]]) -> list[Any]:
    """The processes of a node started after ``before`` was taken: this process's new Ray children (GCS, raylet,
    reaper, agents) and all their descendants. Children that existed before (Prefect's server, the watchdog,
    another cluster) and their descendants are not included."""
    import psutil

    procs: dict[int, Any] = {}
    for child in psutil.Process().children():
        try:
            key = (child.pid, child.create_time())
        except psutil.Error:
            continue
        if key in before or not _is_ray_process(child):
            continue
        procs[child.pid] = child
        try:
            procs.update({p.pid: p for p in child.children(recursive=True)})
        except psutil.Error:
            pass
    return list(procs.values())


def end_failed_node(before: set[tuple[int, float]], grace_s: float = 5.0) -> None:
    """Undo a failed local start: Ray's own shutdown, then SIGTERM and (after ``grace_s``) SIGKILL for every
    process of the failed node that is still there; bounded (``grace_s`` + 5 s)."""
    import psutil

    procs = failed_node_processes(before)  # the whole tree first: a killed raylet's workers lose their parent
    try:
        ray.shutdown()
    except Exception:  # a half-started node: nothing of Ray's to shut down
        pass
    procs += [p for p in failed_node_processes(before) if p.pid not in {q.pid for q in procs}]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5.0)


def _signal_handlers() -> dict[int, Any]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_signal_handlers(handlers: dict[int, Any]) -> None:
    """Ray's core worker installs a SIGTERM handler that aborts the process (a core dump, exit -6): the
    driver's own handlers come back, so SIGTERM stops a run through every ``finally`` (actors, lock, Prefect)."""
    import signal

    for sig, handler in handlers.items():
        if handler is not None:
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):  # not the main thread after all
                pass


def _pin_auth_token(ray_home: Path, real_home: Path, *, local: bool) -> None:
    """Name Ray's auth token file explicitly (RAY_AUTH_TOKEN_PATH).

    Ray looks for ``~/.ray/auth_token``; HOME differs between ``ray.init`` (the
    bootstrap folder) and the workers (the user's HOME), so without a fixed path
    workers fail to start. A new local cluster gets a fresh token in the
    bootstrap folder; a remote one uses the user's token.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if local:
        import secrets

        token = ray_home / ".ray" / "auth_token"
        private_folder(token.parent)
        if not private_file_ok(token):  # missing, or one another user could have read or planted: a fresh one
            if os.path.lexists(token):
                os.remove(token)
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    elif (real_home / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(real_home / ".ray" / "auth_token")


def key_variables(models: Any) -> frozenset[str]:
    """The variables the model specs read their API keys from (``api_key_env=NAME``; ``OPENAI_API_KEY`` for an
    openai spec without it): secrets whatever their names look like."""
    from certeval.inputs.model_spec import parse_model_spec

    names = set()
    for text in models:
        spec = parse_model_spec(text)
        if spec.kind == "openai":
            names.add(str(spec.option("api_key_env", "OPENAI_API_KEY")))
    return frozenset(names)


def _private(name: str, keys: frozenset[str]) -> bool:
    """Whether a variable travels only by the private channel: secret-looking names, a spec's key variable, and
    every ``OPENAI_*`` (endpoint keys there go by any name, and none is needed at process start)."""
    return is_secret_name(name) or name in keys or name.startswith(_PRIVATE_ENV_PREFIXES)


def _forwarded_env(keys: frozenset[str] = frozenset()) -> dict[str, str]:
    """Variables for the actors' ``runtime_env``: everything they need except secrets (Ray writes a
    runtime_env in plain text to ``runtime_env_agent.log``, readable by anyone on the node)."""
    return {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV_PREFIXES) and not _private(k, keys)}


def _secret_env(keys: frozenset[str] = frozenset()) -> dict[str, str]:
    """Credentials the actors need (S3 keys, endpoint API keys, every variable a spec names as its key): sent
    as an actor constructor argument, which Ray keeps in its object store and never logs, and set in the
    actor's own environment there."""
    return {k: v for k, v in os.environ.items()
            if (k.startswith(_FORWARDED_ENV_PREFIXES) or k in keys) and _private(k, keys)}
