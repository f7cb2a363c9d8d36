"""The range of every whole-number flag, checked while the command line is parsed: before anything is read, started
or written, and named by the flag itself (``argument --reps: must be a whole number in [1, 100000], got ...``).

A flag's bound is where a larger value stops meaning anything but a typo or a machine's memory: ``--reps 10**9``
ended in MemoryError, ``--replicas 10**5`` waited for actors no cluster could place. Ranges that depend on other
flags (``--top`` against the models, ``--halfwidth`` by target) are checked with the plan, still before start-up.
"""

from __future__ import annotations

import argparse

# flag -> (least, most): the same bound wherever the flag appears (live commands, backtests, demo)
INT_RANGES = {
    "--reps": (1, 100_000),
    "--max-items": (1, 100_000_000),
    "--batch-size": (1, 1_000_000),
    "--replicas": (1, 256),
    "--in-flight": (1, 64),
    "--num-cpus": (1, 4096),
    "--seed": (0, 2**63 - 1),
    "--pairs": (1, 1_000_000),
    "--history-models": (1, 1_000_000),
    "--top": (1, 1_000_000),
    "--lm-items": (1, 1_000_000),
}


def whole_number(flag: str, least: int, most: int):
    """An argparse ``type`` taking a whole number in [least, most] for ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number in [{least}, {most}], got {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be a whole number in [{least}, {most}], got {text!r}")
        return value

    parse.__name__ = flag
    return parse


def bound_whole_numbers(parser: argparse.ArgumentParser) -> None:
    """Give every whole-number flag of ``parser`` and its subcommands its range from :data:`INT_RANGES`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                bound_whole_numbers(child)
        elif action.type is int:
            flag = next((f for f in action.option_strings if f in INT_RANGES), None)
            if flag is not None:
                action.type = whole_number(flag, *INT_RANGES[flag])
