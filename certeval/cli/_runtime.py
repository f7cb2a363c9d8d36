"""The runtime flags shared by the commands that start models, Ray or Prefect (certeval.runtime.options).

They change how a command runs, never what it computes: a run resumed with other values is the same run.
"""

from __future__ import annotations

import argparse

from certeval.runtime.options import (
    DEFAULT_ACTOR_START_TIMEOUT_S,
    DEFAULT_BATCH_TIMEOUT_S,
    FLAGS,
    PROPOSE_AHEAD,
    RuntimeOptions,
)

ALL = tuple(FLAGS)


def add_runtime_options(parser: argparse.ArgumentParser, only: tuple[str, ...] = ALL) -> None:
    """Add the flags of the ``RuntimeOptions`` fields in ``only`` to ``parser``, in one help group."""
    group = parser.add_argument_group("runtime", "how the command runs; not part of the run's identity "
                                                 "(a resumed run may change them)")
    helps = {
        "actor_start_timeout_s": dict(type=float, default=DEFAULT_ACTOR_START_TIMEOUT_S, metavar="S",
                                      help="seconds the model actors may take to start and load their model "
                                           f"(default {DEFAULT_ACTOR_START_TIMEOUT_S:g})"),
        "batch_timeout_s": dict(type=float, default=DEFAULT_BATCH_TIMEOUT_S, metavar="S",
                                help="seconds scoring may go without any batch coming back before the run fails "
                                     f"(exit 3; default {DEFAULT_BATCH_TIMEOUT_S:g})"),
        "call_log": dict(default=None, metavar="FILE",
                         help="every model actor appends 'model<TAB>item_id' to FILE per item it scored"),
        "watchdog": dict(action="store_false",
                         help="do not start the watchdog that ends this command's Ray and Prefect processes "
                              "after a SIGKILL"),
        "parallel_start": dict(action="store_false",
                               help="start Prefect, Ray and the model actors one after another (the older, "
                                    "slower start-up)"),
        "startup_log": dict(default=None, metavar="FILE",
                            help="append one line per start-up phase (phase, unix time, pid) to FILE"),
        "cache_dir": dict(default=None, metavar="DIR",
                          help="where converted models and embeddings are cached (default "
                               "$XDG_CACHE_HOME/certeval or ~/.cache/certeval)"),
        "propose_ahead": dict(default="auto", choices=PROPOSE_AHEAD,
                              help="queue the next round's items on the models while this round's scores are "
                                   "absorbed and decided on (auto: unless every model replays recorded scores); "
                                   "results are the same, items scored beyond the stop are kept and reported"),
        "keep_actors": dict(action="store_true",
                            help="on a Ray that outlives this command (certeval up, --ray-address): leave the "
                                 "model actors loaded for the next --keep-actors command on the same models, and "
                                 "take such actors when they exist (certeval down ends them)"),
    }
    for name in only:
        group.add_argument(FLAGS[name], dest=name, **helps[name])


def runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    """The parsed flags as checked options (InputError naming the flag and its value: exit 2, nothing written)."""
    return RuntimeOptions(**{name: getattr(args, name) for name in ALL if hasattr(args, name)})
