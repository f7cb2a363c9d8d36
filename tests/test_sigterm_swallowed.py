"""A SIGTERM whose exception Python swallows still ends the command.

The handler raises ``Terminated`` in the main thread; when the main thread is inside a weakref callback at that
moment (importlib's module-lock cleanup while Prefect is imported in a thread), Python prints "Exception ignored"
and runs on: a fresh-clone run once hung 120 s past its SIGTERM that way. ``main`` re-delivers a swallowed
interrupt. Here a weakref callback raises the handler's exception, as the signal did there."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import functools, signal, sys, time, weakref
    from certeval import cli

    signal.signal(signal.SIGTERM, cli._on_sigterm)
    if sys.argv[1] == "redeliver":  # what main() installs
        sys.unraisablehook = functools.partial(cli._redeliver_swallowed, default=sys.unraisablehook)

    class Held:
        pass

    def callback(ref):
        cli._on_sigterm(signal.SIGTERM, None)  # the handler, run inside a callback that cannot raise

    held = Held()
    ref = weakref.ref(held, callback)
    try:
        del held  # the callback runs; its exception is unraisable
        time.sleep(3)
        print("ran on")
    except cli.Terminated:
        print("terminated")
""")


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_swallowed_sigterm_is_delivered_again_and_nothing_is_printed_for_it():
    done = _run("redeliver")
    assert done.stdout.strip() == "terminated", (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr, done.stderr


def test_without_the_redelivery_the_sigterm_is_lost():
    """The control: Python's own hook prints it and the script runs on (what the test above guards against)."""
    done = _run("plain")
    assert done.stdout.strip() == "ran on", (done.stdout, done.stderr)
    assert "Exception ignored" in done.stderr and "Terminated" in done.stderr
