"""Process environment that keeps Ray, Prefect, botocore and Hugging Face offline and on loopback.

Called by the CLI and by the tests before those libraries are imported. Only
sets variables the user has not set (``setdefault``), except where noted.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def configure_offline_env(home: str | Path | None = None) -> None:
    defaults = {
        # Ray: bind loopback only, no usage stats (NOTES.md)
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        # Prefect: embedded server, no analytics, patient start on a loaded box
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # botocore: never probe the EC2 metadata endpoint
        "AWS_EC2_METADATA_DISABLED": "true",
        # Hugging Face: models come from packages, never the hub
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if home is not None:
        os.environ.setdefault("PREFECT_HOME", str(Path(home) / "prefect"))


def ray_bootstrap_home(base: str | Path) -> Path:
    """A HOME holding ``ray_bootstrap_config.yaml`` (``provider: {type: local}``).

    Ray's usage-stats module probes cloud metadata (169.254.169.254) unless this
    file exists in $HOME while ``ray.init`` runs (NOTES.md).
    """
    home = Path(base) / "ray-home"
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "ray_bootstrap_config.yaml"
    if not cfg.exists():
        cfg.write_text("provider: {type: local}\n")
    return home


RAY_PROBE_S = 5.0


def check_ray_address(address: str | None, timeout_s: float = RAY_PROBE_S) -> None:
    """Fail in ``timeout_s`` with one line when a ``host:port`` / ``ray://host:port`` Ray address does not
    accept connections (``ray.init`` would retry for minutes and ignore SIGTERM meanwhile)."""
    from .estimators._validation import InputError

    if not address or address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(f"--ray-address must be host:port or ray://host:port, got {address!r}")
    host = host.strip("[]")
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as exc:
        waited = time.monotonic() - t0
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or type(exc).__name__)
        raise InputError(f"--ray-address {address!r} did not answer ({reason} after {waited:.1f} s); "
                         "is the Ray head running there?") from None
