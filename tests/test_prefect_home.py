"""Every file of the Prefect home certeval picks stays in it: Prefect 3.7 documents its result storage and its
server's block-registration memo as inside ``PREFECT_HOME`` but resolves both under ``~/.prefect`` whatever the home
is, so a zero-config run whose state is "in ./.prefect" wrote a failed flow's pickled exception, and its embedded
server's memo, into the user's HOME. The control: the same failing flow with only ``PREFECT_HOME`` set (what
certeval set before) writes there, and the same check catches it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from certeval.runtime.envsetup import prefect_home_env
from certeval.runtime.options import default_cache_dir

ROOT = Path(__file__).resolve().parents[1]

FAILING_FLOW = """
import os, sys
from certeval.runtime.envsetup import prepare_env
if sys.argv[1] == "certeval":
    prepare_env()
else:  # the control: the home alone, as certeval set it before
    os.environ["PREFECT_HOME"] = os.path.join(os.getcwd(), ".prefect")
from certeval.services.prefect_database import seed_new_home
seed_new_home(None, sys.argv[2])  # the kept migrated database, where there is one: a shorter start
from prefect import flow

@flow(persist_result=False)
def failing():
    raise ValueError("planned")

try:
    failing()
except ValueError:
    pass
"""


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    return env


def test_prefect_home_env_puts_storage_and_memo_inside_the_home(tmp_path):
    env = prefect_home_env(tmp_path / "p")
    assert env == {"PREFECT_HOME": str(tmp_path / "p"),
                   "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "p" / "storage"),
                   "PREFECT_SERVER_MEMO_STORE_PATH": str(tmp_path / "p" / "memo_store.toml")}


@pytest.mark.slow
@pytest.mark.parametrize("setup,in_home", [("certeval", False), ("home-only", True)])
def test_a_zero_config_failed_flow_writes_nothing_in_the_users_home(setup, in_home, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", FAILING_FLOW, setup, str(default_cache_dir())], cwd=work,
                          env=_clean_env(home), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    stored = list((work / ".prefect" / "storage").glob("*"))
    if in_home:  # Prefect's own default: the pickled exception lands in HOME
        assert any(name.startswith(".prefect/storage/") for name in written) and not stored, written
    else:
        assert written == [], written
        assert len(stored) == 1 and (work / ".prefect" / "memo_store.toml").is_file()
