"""Ray for the model actors: a local Ray on loopback (or a running cluster), and the environment actors get
(forwarded variables, secrets kept out of Ray's runtime_env)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import ray

from ..envsetup import configure_offline_env, ray_bootstrap_home
from ..redact import is_secret_name
from ..estimators._validation import InputError

NAMESPACE = "certeval"
# the user's infrastructure an actor needs from the driver even when Ray was started earlier (e.g. a test
# session); certeval's own settings reach the actors as constructor arguments (RuntimeOptions)
_FORWARDED_ENV_PREFIXES = ("RAY_AUTH_", "AWS_", "HF_", "TRANSFORMERS_", "OPENAI_", "TOKENIZERS_", "CUDA_VISIBLE")
_PRIVATE_ENV_PREFIXES = ("OPENAI_",)


def init_ray(address: str | None = None, *, num_cpus: int = 2, object_store_mb: int = 200,
             state_dir: str | Path | None = None, prestart_workers: bool = True) -> None:
    """Start a local Ray (loopback only) or connect to ``address``; idempotent.

    HOME points at a folder holding ``ray_bootstrap_config.yaml`` while
    ``ray.init`` runs, or Ray's usage-stats module probes cloud metadata
    (NOTES.md); workers get the real HOME back through ``runtime_env``.
    """
    if ray.is_initialized():
        return
    configure_offline_env()
    base = Path(state_dir) if state_dir else Path(tempfile.gettempdir()) / f"certeval-ray-{os.getuid()}"
    real_home = os.environ.get("HOME", str(Path.home()))
    ray_home = ray_bootstrap_home(base)
    _pin_auth_token(ray_home, Path(real_home), local=not address)
    os.environ["HOME"] = str(ray_home)
    handlers = _signal_handlers()
    try:
        common = dict(namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                      runtime_env={"env_vars": {"HOME": real_home}})
        if address:
            from ..envsetup import check_ray_address

            check_ray_address(address)  # bounded: ray.init alone retries a closed port for minutes
            try:
                ray.init(address=address, **common)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InputError(f"--ray-address {address!r} is unreachable: {str(exc).splitlines()[0]}") from None
        else:
            # prestart_workers=False: no idle task workers started for the driver; model actors never use them
            # (each starts its own worker) and on 2 cores their imports delay the start-up (benchmarks/startup.py)
            extra = {} if prestart_workers else {"_system_config": {"prestart_worker_first_driver": False}}
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     object_store_memory=object_store_mb * 2**20, **extra, **common)
    finally:
        os.environ["HOME"] = real_home
        _restore_signal_handlers(handlers)


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
        if not token.exists():
            token.parent.mkdir(parents=True, exist_ok=True)
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    elif (real_home / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(real_home / ".ray" / "auth_token")


def key_variables(models: Any) -> frozenset[str]:
    """The variables the model specs read their API keys from (``api_key_env=NAME``; ``OPENAI_API_KEY`` for an
    openai spec without it): secrets whatever their names look like."""
    from .base import parse_model_spec

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
