"""A CPU-hosted model's actor uses every CPU it was given (issue 42: Ray sets ``OMP_NUM_THREADS=1`` for an actor
without a CPU count, so the hf host once ran one thread where lm-eval ran one per core): it scores up to one call
per CPU at once (at most the calls queued to it), each on its CPUs' share of torch threads. A tiny random llama
(SmolLM2's tokenizer) keeps the actor's start short; no speed is asserted."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray(state_dir):
    """The shared local Ray (no Prefect: these tests start actors directly)."""
    from test_pipeline_support import ray_address

    return ray_address(state_dir)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from certeval.inputs.smollm import converted_dir

    source = converted_dir()
    if not (source / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 is not converted (scripts/test.sh converts it)")
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def _placement(pool) -> dict:
    (entry,) = pool.placement()
    return entry


def _free_cpus(at_least: int = 0, wait_s: float = 60.0) -> int:
    """The CPUs the shared Ray has free, once an actor killed just before has given its CPUs back (Ray frees them
    a moment after ray.kill)."""
    import time

    import ray

    deadline = time.monotonic() + wait_s
    while True:
        free = int(ray.available_resources().get("CPU", 0))
        if free >= at_least or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


def test_the_actor_uses_every_cpu_it_was_given_as_calls_at_once_and_torch_threads(local_ray, tiny_model):
    from certeval.hosting.pool import Actors, ModelPool

    spec = f"hf:{tiny_model}?batch=4"
    free = _free_cpus()
    for asked, in_flight in ((1.0, 2), (None, 2), (None, 1)):  # one CPU; the default (the free CPUs); one call queued
        _free_cpus(free)
        pool = ModelPool({"tiny": spec}, Actors(num_cpus=asked, in_flight=in_flight)).start()
        try:
            placed = _placement(pool)
            cpus = 1 if asked else max(1, free)
            at_once = min(cpus, in_flight)
            assert placed["cpus"] == cpus, placed
            assert placed["calls_at_once"] == at_once and placed["torch_threads"] == max(1, cpus // at_once), placed
            item = {"item_id": "q", "question": "What is 2 + 2?", "choices": ["4", "5"], "answer": 0}
            (result,) = pool.score({"tiny": [("k", item)]}, 1)["tiny"]
            assert result["score"] in (0.0, 1.0)
        finally:
            pool.shutdown()


def test_an_actor_scores_its_queued_calls_at_once_and_each_as_it_would_alone(local_ray, tiny_model):
    """Two calls sent together to an actor given two calls at once run side by side (the actor's own count of the
    calls running at its busiest) and answer what the same calls give one at a time; control: an actor given one
    call at a time (one CPU) never runs two."""
    import ray

    from certeval.hosting.pool import Actors, ModelPool

    if _free_cpus(2) < 2:
        pytest.skip("the shared Ray has fewer than 2 CPUs")
    spec = f"hf:{tiny_model}?batch=8&max_new_tokens=32"
    calls = [[("tiny", [{"item_id": f"q{c}-{i}", "question": f"Name {c * 40 + i} animals.", "answer": "cat"}
                        for i in range(40)], [f"k{c}-{i}" for i in range(40)])] for c in range(2)]
    answers, most = {}, {}
    for asked in (None, 1.0):
        _free_cpus(2)
        pool = ModelPool({"tiny": spec}, Actors(num_cpus=asked, in_flight=2)).start()
        try:
            (slot,) = pool.slots["tiny"]
            answers[asked] = ray.get([slot.handle.score.remote(parts) for parts in calls], timeout=300)
            most[asked] = ray.get(slot.handle.ping.remote(), timeout=60)["most_calls_at_once"]
        finally:
            pool.shutdown()
    assert most == {None: 2, 1.0: 1}
    strip = [[[(r["item_id"], r["score"], r["output"]) for r in part] for part in call] for call in answers[None]]
    assert strip == [[[(r["item_id"], r["score"], r["output"]) for r in part] for part in call] for call in answers[1.0]]


def test_two_cpu_hosted_models_split_the_free_cpus_and_replay_takes_none(local_ray, tiny_model):
    import ray

    from certeval.hosting.pool import ModelPool

    free = _free_cpus(int(ray.cluster_resources().get("CPU", 0)))
    pool = ModelPool({"a": f"hf:{tiny_model}", "b": f"hf:{tiny_model}?threads=1",
                      "r": "replay:bundled:helm_mmlu#openai_ada"})
    try:
        pool.launch()
        share = max(1, free // 2) if free >= 2 else None
        if share is None:  # one CPU: the two models share an actor (CpuPlan.shared_groups)
            pytest.skip("the shared Ray has fewer than 2 CPUs free")
        assert pool._actor_cpus("a") == pool._actor_cpus("b") == share and pool._actor_cpus("r") == 0.0
        pool.wait_started()
        threads = {p["group"]: p["torch_threads"] for p in pool.placement()}
        assert threads["a"] == share and threads["b"] == 1  # the spec's own threads= wins
        assert threads["r"] is None  # replay imports no torch
    finally:
        pool.shutdown()


def test_kept_actors_serve_the_next_command_with_the_model_loaded(local_ray, tiny_model, tmp_path):
    """--keep-actors: a pool's actors outlive its shutdown (named, detached) and the next pool on the same model
    spec takes the same process, whatever its labels, writing to its own score cache."""
    import ray

    from certeval.hosting.pool import Actors, ModelPool
    from certeval.hosting.pool_groups import kill_kept_actors
    from certeval.storage import ScoreCache, filesystem

    spec = f"hf:{tiny_model}?batch=4"
    item = {"item_id": "q", "question": "What is 2 + 2?", "choices": ["4", "5"], "answer": 0}
    first_cache, second_cache = str(tmp_path / "first"), str(tmp_path / "second")
    kill_kept_actors()
    try:
        first = ModelPool({"a": spec}, Actors(num_cpus=1, keep=True), cache_urls={"a": first_cache}).start()
        one = _placement(first)
        assert one["kept"] and not one["reused"]
        first.score({"a": [("k1", item)]}, 1)
        first.shutdown()
        assert ray.get_actor(one["actor"], namespace="certeval") is not None  # still there, model loaded
        second = ModelPool({"b": spec}, Actors(num_cpus=1, keep=True), cache_urls={"b": second_cache}).start()
        two = _placement(second)
        assert two["reused"] and two["actor"] == one["actor"] and two["pid"] == one["pid"]
        (result,) = second.score({"b": [("k2", item)]}, 1)["b"]
        assert result["score"] in (0.0, 1.0)
        second.shutdown()
        assert set(ScoreCache(*filesystem(second_cache)).load()) == {"k2"}  # the second command's cache
        assert set(ScoreCache(*filesystem(first_cache)).load()) == {"k1"}
        other = ModelPool({"c": spec}, Actors(num_cpus=1)).start()  # without keep: an actor of its own, killed after
        assert not _placement(other)["kept"] and _placement(other)["pid"] != one["pid"]
        other.shutdown()
    finally:
        killed = kill_kept_actors()
    assert one["actor"] in killed


def test_idle_openmp_threads_spin_briefly_only_where_other_work_fills_the_cores():
    """The spin rule of the actors' OpenMP threads (docs/pipeline.md): OpenMP's long default spin on a box with
    cores to spare, a brief one (GOMP_SPINCOUNT) where the load already fills them."""
    from certeval.hosting.pool import _cores_busy

    assert not _cores_busy(load=0.4, cores=2) and not _cores_busy(load=2.5, cores=2)  # the command's own work
    assert _cores_busy(load=3.0, cores=2) and _cores_busy(load=17.0, cores=2) and not _cores_busy(load=17.0, cores=32)


def test_a_specs_own_threads_are_each_calls_and_other_actors_take_one_call_at_a_time():
    """The layout rule alone (no actor): one call per CPU, at most the calls queued; a spec's ``threads=N`` is each
    call's (4 CPUs hold two calls of 2 threads, not four); GPU, replay and OpenAI actors one call at a time."""
    from certeval.hosting.pool_cpus import CpuPlan

    models = {"a": "hf:/m", "b": "hf:/m?threads=2", "c": "hf:/m?threads=8", "g": "hf:/m?device=cuda",
              "r": "replay:bundled:helm_mmlu#openai_ada", "o": "openai:http://127.0.0.1:9#m"}
    plan = CpuPlan(models, replicas=1, num_gpus=0.0, num_cpus=None, host_kwargs={})
    assert [plan.calls_at_once(["a"], cpus, 2) for cpus in (1, 2, 4)] == [1, 2, 2]
    assert plan.calls_at_once(["a"], 4, 8) == 4 and plan.threads(["a"], 4, 4) == 1 and plan.threads(["a"], 4, 2) == 2
    assert plan.calls_at_once(["b"], 4, 8) == 2 and plan.calls_at_once(["b"], 2, 2) == 1
    assert plan.calls_at_once(["c"], 4, 2) == 1  # more threads asked than CPUs: one call
    assert [plan.calls_at_once([m], 4, 2) for m in ("g", "r", "o")] == [1, 1, 1]
    assert plan.threads(["r"], 0, 1) is None
