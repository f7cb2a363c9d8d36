"""Which models share an actor (replays of one scores file), the actors kept across commands, and small helpers
of the pool's driver. Split from :mod:`certeval.hosting.pool`."""

from __future__ import annotations

from typing import Any

import ray

from certeval.errors import InputError

from .ray_setup import NAMESPACE

KEPT_PREFIX = "kept/"  # the names of actors kept alive across commands (ModelPool(keep=True))


def _text_length(item: dict[str, Any]) -> int:
    """Characters of an item's text fields (a cheap stand-in for its tokens)."""
    total = 0
    for value in item.values():
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, (list, tuple)):
            total += sum(len(v) for v in value if isinstance(v, str))
    return total


def kill_kept_actors() -> list[str]:
    """Kill every actor a ``--keep-actors`` command left on the connected Ray (their CPUs and memory back); their
    names. ``certeval down`` ends them with the cluster anyway."""
    names = [a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors(all_namespaces=True)
             if (a.get("namespace") if isinstance(a, dict) else NAMESPACE) == NAMESPACE]
    killed = []
    for name in names:
        if not str(name).startswith(KEPT_PREFIX):
            continue
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            killed.append(name)
        except Exception:  # gone meanwhile
            pass
    return killed


def _cluster_summary() -> str:
    try:
        res = ray.cluster_resources()
        return f"{res.get('CPU', 0):g} CPU(s), {res.get('GPU', 0):g} GPU(s)"
    except Exception:  # the cluster itself is gone
        return "no answer"


def group_models(models: dict[str, str]) -> dict[str, list[str]]:
    """Actor groups: replay models of one scores file (same options) share a group; any other model,
    or a replay file with a single model, is a group of its own, named by its label."""
    from certeval.inputs.model_spec import parse_model_spec

    by_file: dict[tuple, list[str]] = {}
    for label, text in models.items():
        try:
            spec = parse_model_spec(text)
        except InputError:  # the actor raises it at start, as for any bad spec
            spec = None
        key = ("replay", spec.location, spec.options) if spec is not None and spec.kind == "replay" else ("own", label)
        by_file.setdefault(key, []).append(label)
    groups: dict[str, list[str]] = {}
    for n, (key, labels) in enumerate(by_file.items()):
        if len(labels) == 1:
            groups[labels[0]] = labels
        else:
            stem = str(key[1]).rstrip("/").split("/")[-1].replace(":", "-") or "scores"
            groups[f"replay-{n}-{stem}"] = labels
    return groups
