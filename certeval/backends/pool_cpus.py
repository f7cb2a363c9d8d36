"""How a pool shares the machine's CPUs among its model actors: each CPU-hosted model's share of the free CPUs,
its torch threads, models sharing an actor when the cluster is short. Split from :mod:`certeval.backends.pool`."""

from __future__ import annotations

import sys

import ray

from ..estimators._validation import InputError


class PoolCpus:
    """Mixed into :class:`certeval.backends.pool.ModelPool` (its models, groups and options)."""

    def _actor_cpus(self, group: str) -> float:
        """The CPUs an actor of ``group`` asks Ray for: ``num_cpus`` when given; 0 for replay; a CPU-hosted
        model's share of the free CPUs (:meth:`_cpu_shares`, set at launch); else 1."""
        replay = all(self.models[label].startswith("replay:") for label in self.groups[group])
        if self.num_cpus is not None:
            return self.num_cpus
        return 0.0 if replay else self._cpu_share.get(group, 1.0)

    def _on_cpu(self, group: str) -> bool:
        """Whether the group's models compute on the actor's CPUs (hf on its default device, cpu): their speed
        is the CPUs, and torch's threads, the actor is given."""
        from .base import parse_model_spec

        try:
            specs = [parse_model_spec(self.models[label]) for label in self.groups[group]]
        except InputError:  # the actor raises it at start
            return False
        device = str(self.host_kwargs.get("device", "cpu"))
        return self.num_gpus <= 0 and all(s.kind == "hf" and str(s.option("device", device)) == "cpu" for s in specs)

    def _actor_threads(self, group: str, cpus: float) -> int | None:
        """torch threads of a CPU-hosted model's actor: the CPUs it was given (at least 1); None for the others."""
        return max(1, int(cpus)) if self._on_cpu(group) else None

    def _cpu_shares(self) -> dict[str, float]:
        """CPU-hosted models split the CPUs Ray has free among their actors (whole CPUs, at least 1 each, at
        most one node's): one model on a 2-core machine gets both cores and runs torch on two threads, as
        lm-eval does there, where one CPU each (Ray's OMP_NUM_THREADS=1) left one core idle; two models get
        one core each and run side by side. Other non-replay actors (openai, vllm on a GPU) keep 1 CPU."""
        if self.num_cpus is not None:
            return {}
        mine = [g for g in self.groups if self._on_cpu(g)]
        if not mine:
            return {}
        others = sum(1 for g in self.groups if g not in mine
                     and not all(self.models[label].startswith("replay:") for label in self.groups[g]))
        try:
            free = float(ray.available_resources().get("CPU", 0.0))
            node = max((float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")),
                       default=1.0)
        except Exception:  # no answer from the cluster: Ray's own default of one CPU
            return {}
        share = int((free - others * self.replicas) // (len(mine) * self.replicas))
        share = max(1, min(int(node), share))
        return {g: float(share) for g in mine}

    def _share_when_short(self) -> None:
        """Models whose actors would need more CPUs than the cluster has share actors instead (each actor hosts
        several models and serves their batches one after another): queued, never left waiting for a CPU that
        no node will free. Said on stderr and kept in ``stats.shared`` (results.json: pipeline.shared_actors)."""
        need = {g: self._actor_cpus(g) for g in self.groups}
        per_actor = max(need.values(), default=0.0)
        have = float(ray.cluster_resources().get("CPU", 0.0))
        if per_actor <= 0 or self.num_gpus > 0 or sum(need.values()) * self.replicas <= have:
            return
        slots = max(1, int(have // (per_actor * self.replicas)))
        merged: dict[str, list[str]] = {}
        for n, labels in enumerate(self.groups.values()):
            merged.setdefault(f"shared-{n % slots}", []).extend(labels)
        self.groups = merged
        self.group_of = {label: g for g, labels in merged.items() for label in labels}
        self.stats.shared = {g: list(labels) for g, labels in merged.items() if len(labels) > 1}
        print(f"certeval: {len(self.models)} models would need {sum(need.values()) * self.replicas:g} CPUs for their "
              f"actors, the Ray cluster has {have:g}: they share {slots * self.replicas} actor(s), each serving its "
              "models one batch at a time", file=sys.stderr, flush=True)

    def _check_resources(self) -> None:
        """An actor asking for GPUs no node has would wait for ever: refuse it before creating any."""
        if self.num_gpus <= 0:
            return
        have = float(ray.cluster_resources().get("GPU", 0.0))
        if have < self.num_gpus:
            raise InputError(f"--num-gpus {self.num_gpus:g} asks each model actor for GPUs, but the Ray cluster "
                             f"has {have:g} GPU(s) in all; drop --num-gpus or use a cluster with GPUs")
