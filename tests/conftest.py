"""Test-wide environment: offline, loopback only, project-local state.

A guard refuses any socket connection from the test process to an address
outside 127.0.0.0/8 (and ::1): a test that tries one fails loudly.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
from pathlib import Path

import pytest
from session_leaks import check_session, record_files

# one BLAS thread: on a loaded 2-core machine a threaded OpenBLAS made a 40×600 SVD 200× slower
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# OpenMP threads (torch's, in model actors, lm-eval runs and tests) spin only briefly before they sleep: the suite's
# workers keep every core busy, the case certeval.hosting.pool._cores_busy judges from the load average when an actor
# starts; an actor kept for a module decides once, and its long default spin burnt CPU the other workers needed
os.environ.setdefault("GOMP_SPINCOUNT", "3000")
_STATE = Path(tempfile.mkdtemp(prefix="certeval-tests-"))

from certeval.runtime.envsetup import configure_offline_env  # noqa: E402

configure_offline_env(_STATE)  # Prefect's home (with its result storage and memo) in the session's temporary folder


def _check_results_on_write() -> None:
    """Every results.json a test writes in this process (flows, the CLI's main) is validated against
    the shipped results.schema.json on its way to disk (tests/test_results_schema.py checks stored runs of each kind
    that CLI subprocesses write)."""
    from certeval.record import results as results_record

    record = results_record.RunResults

    def to_json(self, _plain=record.to_json):
        out = _plain(self)
        results_record.validate(out)
        return out

    to_json.plain = record.to_json  # the unchecked writer (a user's run)
    record.to_json = to_json


_check_results_on_write()

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_loopback(address) -> bool:
    if isinstance(address, (str, bytes)):  # unix socket path
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname other than localhost would need DNS


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may only connect to loopback, tried {address!r}")
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may only connect to loopback, tried {address!r}")
    return _real_connect_ex(self, address)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE


@pytest.fixture(scope="module")
def infra(state_dir):
    """The pipeline tests' Prefect API and Ray cluster on loopback (started once, reused); Ray's address."""
    from test_pipeline_support import prefect_api, ray_address

    prefect_api()
    return ray_address(state_dir)


@pytest.fixture(scope="module")
def kept_actors(infra):
    """``--keep-actors`` for a module's runs on the shared Ray: a later command on the same model spec adopts the
    loaded actor instead of starting one. Yields the killer: a kept actor holds its CPUs, so a run on another
    model spec frees them first (the killer also waits for a finished command's actors to give theirs back); all
    are killed after the module too."""
    import time

    import ray

    from certeval.hosting.pool_groups import kill_kept_actors

    def kill() -> list[str]:
        killed = kill_kept_actors()
        deadline = time.monotonic() + 30  # Ray frees a killed actor's CPUs a moment later (a finished command's
        # actors too); the next actor's CPU share (and torch threads) is counted from the free ones
        while time.monotonic() < deadline and (
                ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0)):
            time.sleep(0.2)
        return killed

    kill()
    yield kill
    kill()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    from certeval.inputs.banks import DATA_DIR

    return DATA_DIR


# The longest files first (a fresh clone's --durations, 2026-11-28; the lm-eval differential files of 2026-12-06
# beside the lm-eval files they resemble: each runs lm-eval on SmolLM2 and a live SmolLM2 run): scripts/test.sh runs
# three workers that take whole files (pytest-xdist --dist loadfile) in collection order, so a long file started
# last would leave a core idle at the end. Order only; nothing else moves.
LONGEST_FIRST = ("test_benchmarks_quick.py", "test_faults.py", "test_prefect_server_cron.py",
                 "test_surfaces_faults.py", "test_rescore.py", "test_cluster_ray.py", "test_startup_under_load.py",
                 "test_actor_threads.py", "test_lm_eval_conformance.py", "test_lm_eval_conformance_outputs.py",
                 "test_lm_eval_flags.py", "test_lm_eval_tasks.py", "test_list_column_banks.py", "test_fast_start.py",
                 "test_pipeline_e2e.py", "test_lm_eval_generation.py", "test_select_checkpoints.py",
                 "test_services.py", "test_conformance.py", "test_deployment_checkpoints.py", "test_look_log.py",
                 "test_propose_ahead.py", "test_network_loopback.py", "test_history_method.py",
                 "test_resume_crash.py", "test_history_pipeline.py", "test_bank_ranking.py")


def pytest_configure(config):
    record_files(config)  # the checkout and HOME's certeval places, to compare at the end


@pytest.hookimpl(trylast=True)  # after xdist's own sessionfinish has shut its workers down
def pytest_sessionfinish(session, exitstatus):
    from test_pipeline_support import shutdown

    shutdown()  # this process's shared Prefect server and Ray now, not at exit: the check below would see them
    check_session(session)  # no process left, no file written outside the temporary folders (tests/session_leaks.py)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file and test order kept otherwise
