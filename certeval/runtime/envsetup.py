"""Process environment that keeps Ray, Prefect, botocore and Hugging Face offline and on loopback.

Called by the CLI and by the tests before those libraries are imported. Only
sets variables the user has not set (``setdefault``), except where noted.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def user_prefect_configured() -> bool:
    """Whether the user set Prefect up: an API URL or profile in the environment, or a profiles file in
    their Prefect home (``$PREFECT_HOME``, default ``~/.prefect``). Then their server and profile are used
    as they are; certeval only picks a project-local home (embedded server) when nothing is configured."""
    if any(os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_HOME",
                                       "PREFECT_PROFILES_PATH")):
        return True
    return (Path.home() / ".prefect" / "profiles.toml").is_file()


def prefect_home_env(home: str | Path) -> dict[str, str]:
    """``PREFECT_HOME`` for a Prefect home certeval picks, with the two paths Prefect documents as inside it but
    resolves under ``~/.prefect`` whatever the home is (Prefect 3.7: the defaults of its results and server settings
    never see the home): the local result storage, where Prefect pickles a failed flow's or task's exception, and the
    server's block-registration memo. Without them a run whose state is "in ./.prefect" writes to the user's HOME."""
    home = Path(home)
    return {"PREFECT_HOME": str(home), "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
            "PREFECT_SERVER_MEMO_STORE_PATH": str(home / "memo_store.toml")}


def _default_prefect_home(home: Path) -> None:
    if "PREFECT_HOME" not in os.environ:
        for key, value in prefect_home_env(home).items():
            os.environ.setdefault(key, value)


def prepare_env() -> None:
    """Offline, loopback-only defaults and a project-local PREFECT_HOME, before Prefect is imported (a live run's
    first step, from the command line or the Python API)."""
    if not user_prefect_configured():
        # zero-config default: Prefect's embedded server with its state in ./.prefect
        _default_prefect_home(Path.cwd() / ".prefect")
    # a failed task would print its traceback through Prefect's console handler; the command prints one line
    # and keeps the traceback in the run folder (exit 3). Prefect's API / UI still receive every run log.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    configure_offline_env()


def configure_offline_env(home: str | Path | None = None) -> None:
    defaults = {
        # Ray: bind loopback only, no usage stats (docs/environment.md)
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
        _default_prefect_home(Path(home) / "prefect")


def ray_state_folder() -> Path:
    """Where a Ray that certeval starts keeps its bootstrap HOME and auth token: one folder per user under the
    temporary folder (a predictable path, so it is made private and checked before every reuse)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"certeval-ray-{os.getuid()}"


def private_folder(path: str | Path, *, create: bool = True) -> Path:
    """``path`` as a folder only this user can enter: created with mode 0700, or, when it exists, a real folder (not
    a link) owned by this user, tightened to 0700 if it was looser. Another user's folder, or a link or file in its
    place (a neighbour may create the predictable path first), is refused in one line: its contents are never
    trusted (the Ray token is a secret)."""
    import stat

    from certeval.errors import InputError

    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{str(path)!r} must be a private folder of this user, but it is "
                         f"{'a link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; remove it (certeval keeps the "
                         "Ray token there)")
    if st.st_uid != os.getuid():
        raise InputError(f"{str(path)!r} belongs to uid {st.st_uid}, not to this user ({os.getuid()}); remove it or "
                         "set TMPDIR to a folder of your own (certeval keeps the Ray token there)")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_file_ok(path: Path) -> bool:
    """Whether an existing secret file may be reused: a regular file (not a link) of this user that nobody else may
    read or write."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ray_bootstrap_home(base: str | Path) -> Path:
    """A HOME holding ``ray_bootstrap_config.yaml`` (``provider: {type: local}``).

    Ray's usage-stats module probes cloud metadata (169.254.169.254) unless this
    file exists in $HOME while ``ray.init`` runs (docs/environment.md).
    """
    private_folder(base)
    home = Path(base) / "ray-home"
    home.mkdir(mode=0o700, exist_ok=True)
    cfg = home / "ray_bootstrap_config.yaml"
    if not cfg.exists():
        cfg.write_text("provider: {type: local}\n")
    return home


RAY_PROBE_S = 5.0


def check_ray_address(address: str | None, timeout_s: float = RAY_PROBE_S) -> None:
    """Fail in ``timeout_s`` with one line when a ``host:port`` / ``ray://host:port`` Ray address does not
    accept connections (``ray.init`` would retry for minutes and ignore SIGTERM meanwhile)."""
    from certeval.errors import InputError

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
