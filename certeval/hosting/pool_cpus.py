"""How a pool shares the machine's CPUs among its model actors: each CPU-hosted model's share of the free CPUs,
the calls it scores at once and their torch threads, models sharing an actor when the cluster is short, GPUs asked
that no node has."""

from __future__ import annotations

import sys
from typing import Any

import ray

from certeval.errors import InputError


class CpuPlan:
    """The CPUs (and GPUs) a pool's actors ask Ray for, from the pool's models and options; an actor group is
    given as the labels it serves."""

    def __init__(self, models: dict[str, str], replicas: int, num_gpus: float, num_cpus: float | None,
                 host_kwargs: dict[str, Any]) -> None:
        self.models = models
        self.replicas = replicas
        self.num_gpus = num_gpus
        self.num_cpus = num_cpus
        self.host_kwargs = host_kwargs

    def _replay(self, labels: list[str]) -> bool:
        return all(self.models[label].startswith("replay:") for label in labels)

    def actor_cpus(self, labels: list[str], share: float = 1.0) -> float:
        """The CPUs an actor serving ``labels`` asks Ray for: ``num_cpus`` when given; 0 for replay; a CPU-hosted
        model's ``share`` of the free CPUs (:meth:`shares`, set at launch); else 1."""
        if self.num_cpus is not None:
            return self.num_cpus
        return 0.0 if self._replay(labels) else share

    def on_cpu(self, labels: list[str]) -> bool:
        """Whether the models compute on the actor's CPUs (hf on its default device, cpu): their speed is the
        CPUs, and torch's threads, the actor is given."""
        from certeval.inputs.model_spec import parse_model_spec

        try:
            specs = [parse_model_spec(self.models[label]) for label in labels]
        except InputError:  # the actor raises it at start
            return False
        device = str(self.host_kwargs.get("device", "cpu"))
        return self.num_gpus <= 0 and all(s.kind == "hf" and str(s.option("device", device)) == "cpu" for s in specs)

    def calls_at_once(self, labels: list[str], cpus: float, in_flight: int) -> int:
        """How many of the calls queued to it (``in_flight``) a CPU-hosted model's actor scores at once: one per CPU
        it was given, each on its own thread (:meth:`threads`); one for every other actor. A decoding step's
        operations (a few rows, one position) are too small to split across cores well: SmolLM2-135M generating on
        two cores did 17-20% more items a second as two calls on one thread each than one call at a time on two
        threads (docs/pipeline.md). A spec's own ``threads=N`` is each call's: its CPUs then hold ``CPUs // N``."""
        if not self.on_cpu(labels):
            return 1
        return max(1, min(int(cpus) // self._spec_threads(labels), int(in_flight)))

    def _spec_threads(self, labels: list[str]) -> int:
        """The torch threads the actor's specs ask for themselves (``threads=N``, the most of them), else 1."""
        from certeval.inputs.model_spec import parse_model_spec

        asked = [parse_model_spec(self.models[label]).option("threads") for label in labels]
        try:
            return max([1, *(int(t) for t in asked if t is not None)])
        except (TypeError, ValueError):  # the host refuses it at start, in one line
            return 1

    def threads(self, labels: list[str], cpus: float, at_once: int = 1) -> int | None:
        """torch threads of a CPU-hosted model's actor: its CPUs shared among the calls it scores at once (at
        least 1 each); None for the others."""
        return max(1, int(cpus) // max(1, int(at_once))) if self.on_cpu(labels) else None

    def shares(self, groups: dict[str, list[str]]) -> dict[str, float]:
        """CPU-hosted models split the CPUs Ray has free among their actors (whole CPUs, at least 1 each, at
        most one node's): one model on a 2-core machine gets both cores and scores two calls at once, one torch
        thread each (:meth:`calls_at_once`), where one CPU (Ray's OMP_NUM_THREADS=1) left one core idle; two models
        get one core each and run side by side. Other non-replay actors (openai, vllm on a GPU) keep 1 CPU."""
        if self.num_cpus is not None:
            return {}
        mine = [g for g, labels in groups.items() if self.on_cpu(labels)]
        if not mine:
            return {}
        others = sum(1 for g, labels in groups.items() if g not in mine and not self._replay(labels))
        try:
            free = float(ray.available_resources().get("CPU", 0.0))
            node = max((float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")),
                       default=1.0)
        except Exception:  # no answer from the cluster: Ray's own default of one CPU
            return {}
        share = int((free - others * self.replicas) // (len(mine) * self.replicas))
        share = max(1, min(int(node), share))
        return {g: float(share) for g in mine}

    def shared_groups(self, groups: dict[str, list[str]]) -> dict[str, list[str]] | None:
        """Models whose actors would need more CPUs than the cluster has share actors instead (each actor hosts
        several models and serves their batches one after another): queued, never left waiting for a CPU that
        no node will free. Said on stderr; the pool keeps it in ``stats.shared`` (results.json:
        pipeline.shared_actors). None when the cluster has the CPUs."""
        need = {g: self.actor_cpus(labels) for g, labels in groups.items()}
        per_actor = max(need.values(), default=0.0)
        have = float(ray.cluster_resources().get("CPU", 0.0))
        if per_actor <= 0 or self.num_gpus > 0 or sum(need.values()) * self.replicas <= have:
            return None
        slots = max(1, int(have // (per_actor * self.replicas)))
        merged: dict[str, list[str]] = {}
        for n, labels in enumerate(groups.values()):
            merged.setdefault(f"shared-{n % slots}", []).extend(labels)
        print(f"certeval: {len(self.models)} models would need {sum(need.values()) * self.replicas:g} CPUs for their "
              f"actors, the Ray cluster has {have:g}: they share {slots * self.replicas} actor(s), each serving its "
              "models one batch at a time", file=sys.stderr, flush=True)
        return merged

    def check_gpus(self) -> None:
        """An actor asking for GPUs no node has would wait for ever: refuse it before creating any."""
        if self.num_gpus <= 0:
            return
        have = float(ray.cluster_resources().get("GPU", 0.0))
        if have < self.num_gpus:
            raise InputError(f"--num-gpus {self.num_gpus:g} asks each model actor for GPUs, but the Ray cluster "
                             f"has {have:g} GPU(s) in all; drop --num-gpus or use a cluster with GPUs")
