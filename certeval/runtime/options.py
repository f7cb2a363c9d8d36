"""How a command runs, never what it computes: bounds on waits, diagnostic logs, the start-up, the cache folder.

:class:`RuntimeOptions` is filled from the command line (``certeval.cli._runtime``) or a flow's ``options``
parameter and travels with the plan (``RunPlan.options``) to where each option is used: the actor pool
(timeouts), the model actors (call log, start-up timeline, cache folder; constructor arguments), the CLI
(watchdog, overlapped start-up). It is never part of a run's identity: ``config.json`` does not keep it,
so a run resumed with another timeout is the same run.

Standard library only and cheap to import: the CLI builds it before anything heavy is imported.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from certeval.errors import InputError

DEFAULT_ACTOR_START_TIMEOUT_S = 900.0  # a large model from a slow disk
DEFAULT_BATCH_TIMEOUT_S = 1800.0  # a slow model's batch; a hung one still ends the run
# the command-line flag of each option: messages name what the user typed
FLAGS = {"actor_start_timeout_s": "--actor-start-timeout", "batch_timeout_s": "--batch-timeout",
         "call_log": "--call-log", "watchdog": "--no-watchdog", "parallel_start": "--sequential-start",
         "startup_log": "--startup-log", "cache_dir": "--cache-dir", "propose_ahead": "--propose-ahead",
         "keep_actors": "--keep-actors"}
PROPOSE_AHEAD = ("auto", "on", "off")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/certeval`` (the user's cache convention), else ``~/.cache/certeval``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg).expanduser() if os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "certeval"


@dataclass(frozen=True)
class RuntimeOptions:
    """Checked on construction (InputError naming the flag and echoing the value).

    ``actor_start_timeout_s``: how long the model actors may take to be placed and load their model;
    ``batch_timeout_s``: how long scoring may go without any batch coming back (a hung model fails the run);
    ``call_log``: a file every model actor appends ``model<TAB>item_id`` to per item it scored;
    ``watchdog``: end this command's Ray/Prefect processes even after a SIGKILL (``certeval.runtime.watchdog``);
    ``parallel_start``: start Prefect's server, Ray and the actors side by side (``certeval.services.fast_start``);
    ``startup_log``: a file the command and its actors append start-up phases to (``certeval.runtime.startup``);
    ``cache_dir``: where converted models and embeddings are kept (None: :func:`default_cache_dir`, resolved
    on the machine that uses it, so a cluster node uses its own);
    ``propose_ahead``: queue each round's predicted successor on the model actors while the controller updates
    and decides (``on``/``off``; ``auto``: on unless every model replays recorded scores). Results are the same
    either way: only the items a round selects are ever used;
    ``keep_actors``: on a Ray that outlives the command (``certeval up``, ``--ray-address``), leave the model
    actors running, loaded, for the next command on the same models, and take such actors when they exist.
    """

    actor_start_timeout_s: float = DEFAULT_ACTOR_START_TIMEOUT_S
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S
    call_log: str | None = None
    watchdog: bool = True
    parallel_start: bool = True
    startup_log: str | None = None
    cache_dir: str | None = None
    propose_ahead: str = "auto"
    keep_actors: bool = False

    def __post_init__(self) -> None:
        for name in ("actor_start_timeout_s", "batch_timeout_s"):
            object.__setattr__(self, name, _seconds(getattr(self, name), FLAGS[name]))
        for name in ("watchdog", "parallel_start", "keep_actors"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("call_log", "startup_log"):
            object.__setattr__(self, name, _log_file(getattr(self, name), FLAGS[name]))
        object.__setattr__(self, "cache_dir", _folder(self.cache_dir, FLAGS["cache_dir"]))
        if self.propose_ahead not in PROPOSE_AHEAD:
            raise InputError(f"{FLAGS['propose_ahead']} must be one of {', '.join(PROPOSE_AHEAD)}, "
                             f"got {self.propose_ahead!r}")

    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def runtime_options(value: Any) -> RuntimeOptions:
    """A flow's or request's ``options``: None (defaults), a :class:`RuntimeOptions`, or a mapping of its fields
    (a deployment's parameters)."""
    if value is None:
        return RuntimeOptions()
    if isinstance(value, RuntimeOptions):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(RuntimeOptions)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InputError(f"options: unknown option {unknown[0]!r}; options: {', '.join(sorted(known))}")
        return RuntimeOptions(**value)
    raise InputError(f"options must be a mapping of {', '.join(f.name for f in fields(RuntimeOptions))}, "
                     f"got {value!r}")


MAX_WAIT_S = 10_000_000.0  # about 116 days: longer waits are typos, and 1e300 s overflowed the clocks waited on


def _seconds(value: Any, flag: str) -> float:
    # never unbounded and never zero: a wait that cannot end, or one that cannot succeed, is a typo
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{flag} must be a positive number of seconds, got {value!r}")
    if value > MAX_WAIT_S:
        raise InputError(f"{flag} must be at most {MAX_WAIT_S:.0f} seconds, got {value!r}")
    return float(value)


def _log_file(value: Any, flag: str) -> str | None:
    """A file to append to: its folder must exist now (checked before anything starts; an actor failing to
    open it mid-run would cost the round)."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InputError(f"{flag} must name a file, got {value!r}")
    path = Path(value).expanduser().absolute()  # actors run elsewhere: never relative to their folder
    if path.is_dir():
        raise InputError(f"{flag} must name a file, got the folder {str(value)!r}")
    if not path.parent.is_dir():
        raise InputError(f"{flag} {str(value)!r}: its folder {str(path.parent)!r} does not exist")
    return str(path)


def _folder(value: Any, flag: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InputError(f"{flag} must name a folder, got {value!r}")
    path = Path(value).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {str(value)!r} is not a folder")
    return str(path)
