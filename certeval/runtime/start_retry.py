"""Bounded retries for a service's start-up (Ray's local node, Prefect's embedded server) on a busy machine.

On a loaded 2-core machine Ray's raylet can miss the 30 s it gets to register with the GCS (a literal in
``ray/_private/node.py``, not a setting) and Prefect's server can miss its start timeout. A start that
fails is cleaned up (its processes ended, so nothing of the failed attempt is left) and tried again after a
pause, a fixed number of times; when every try fails one :class:`StartError` says so in one line, with
what to try next (the CLI prints it and exits 3).

Standard library only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class StartError(RuntimeError):
    """Every try to start a service failed; the message is one line, ending with what to try."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "") or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Retries:
    """How a start-up is retried: up to ``tries`` tries, the next one after ``waits_s[i]`` (the last one repeats;
    ``sleep`` waits). Exceptions outside ``retry_on`` or inside ``never_retry`` (bad arguments, Ctrl-C) are not
    retried."""

    tries: int = 3
    waits_s: Sequence[float] = (5.0, 15.0)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    never_retry: tuple[type[BaseException], ...] = ()
    sleep: Callable[[float], None] = time.sleep


def start_with_retries(start: Callable[[], T], *, what: str, hint: str, retries: Retries = Retries(),
                       cleanup: Callable[[], None] | None = None) -> T:
    """``start()``, tried as ``retries`` says; after a failed try ``cleanup()`` runs (before the pause, so a
    failed attempt's processes never outlive it). An exception not retried propagates at once, after
    ``cleanup()``.
    """
    tries, waits_s, retry_on, never_retry, sleep = (retries.tries, retries.waits_s, retries.retry_on,
                                                    retries.never_retry, retries.sleep)
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries!r}")
    last: BaseException | None = None
    for attempt in range(tries):
        try:
            return start()
        except BaseException as exc:
            if cleanup is not None:
                cleanup()
            if not isinstance(exc, retry_on) or isinstance(exc, never_retry):
                raise
            last = exc
            if attempt + 1 < tries:
                wait = waits_s[min(attempt, len(waits_s) - 1)] if waits_s else 0.0
                log.warning("%s failed to start (try %d of %d: %s); trying again in %g s", what, attempt + 1,
                            tries, first_line(exc), wait)
                if wait > 0:
                    sleep(wait)
    assert last is not None
    raise StartError(f"{what} did not start in {tries} tries (last: {first_line(last)}); {hint}") from last
