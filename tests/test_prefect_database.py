"""A new project folder's Prefect database copied from a migrated one (certeval.services.prefect_database): which
database is seeded, what a template may hold, never over an existing file; and a real embedded server on a seeded
database answering, without what the first folder wrote after its template was kept."""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.request
from pathlib import Path

import pytest

from certeval.services import fast_start
from certeval.services.prefect_database import keep, project_database, seed, seed_new_home, template_database


def _database(path: Path, rows: dict[str, int], wal: bool = True) -> Path:
    """A SQLite file with one table per entry of ``rows`` holding that many rows (WAL mode, as Prefect's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
    for table, n in rows.items():
        con.execute(f'CREATE TABLE "{table}" (x)')
        con.executemany(f'INSERT INTO "{table}" VALUES (?)', [(i,) for i in range(n)])
    con.commit()
    con.close()
    return path


def _rows(path: Path) -> dict[str, int]:
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    finally:
        con.close()


FRESH = {"alembic_version": 1, "block_type": 3, "block_schema": 4, "block_schema_reference": 2, "flow_run": 0}


def test_the_seeded_database_is_prefect_homes_default_one_unless_a_database_url_is_set(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        monkeypatch.delenv(key)
    assert project_database() is None
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    assert project_database() == tmp_path / ".prefect" / "prefect.db"
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", "postgresql+asyncpg://db/prefect")
    assert project_database() is None
    import importlib.metadata

    version = importlib.metadata.version("prefect")
    assert template_database(tmp_path) == tmp_path / "prefect-db" / version / "prefect.db"


def test_a_fresh_database_is_kept_as_one_file_and_one_holding_anything_else_is_not(tmp_path):
    fresh = _database(tmp_path / "a" / "prefect.db", FRESH)
    template = tmp_path / "cache" / "prefect.db"
    assert keep(fresh, template)
    assert _rows(template) == FRESH and not template.with_name("prefect.db-wal").exists()
    assert sqlite3.connect(template).execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [p.name for p in template.parent.iterdir()] == ["prefect.db"]  # no partial copy left
    # one kept already: never replaced
    other = _database(tmp_path / "b" / "prefect.db", {**FRESH, "block_type": 7})
    assert not keep(other, template) and _rows(template)["block_type"] == 3
    # a folder's own rows (a flow run, a key Prefect generated) never become a template; nor does an unmigrated file
    for name, rows in [("ran", {**FRESH, "flow_run": 1}), ("key", {**FRESH, "configuration": 1}),
                       ("unmigrated", {**FRESH, "alembic_version": 0})]:
        elsewhere = tmp_path / name / "template.db"
        assert not keep(_database(tmp_path / name / "prefect.db", rows), elsewhere), name
        assert not elsewhere.exists() and not [p for p in elsewhere.parent.iterdir() if p.name.startswith(".")], name


def test_a_folder_is_seeded_only_when_it_has_no_database(tmp_path):
    template = tmp_path / "cache" / "prefect.db"
    assert not seed(tmp_path / "x" / "prefect.db", template)  # none kept yet
    keep(_database(tmp_path / "a" / "prefect.db", FRESH), template)
    target = tmp_path / "new" / ".prefect" / "prefect.db"
    assert seed(target, template) and _rows(target) == FRESH
    assert sorted(p.name for p in target.parent.iterdir()) == ["prefect.db"]
    # an existing database (or the WAL of one) is never replaced
    mine = _database(tmp_path / "mine" / "prefect.db", {**FRESH, "flow_run": 5})
    assert not seed(mine, template) and _rows(mine)["flow_run"] == 5
    wal_only = tmp_path / "walonly" / "prefect.db"
    wal_only.parent.mkdir()
    wal_only.with_name("prefect.db-wal").write_bytes(b"")
    assert not seed(wal_only, template) and not wal_only.exists()
    # a template holding a folder's rows (written by hand) seeds nothing
    bad = _database(tmp_path / "bad" / "prefect.db", {**FRESH, "flow_run": 1}, wal=False)
    target2 = tmp_path / "new2" / "prefect.db"
    assert not seed(target2, bad) and not target2.exists() and list(target2.parent.iterdir()) == []


def test_prestart_seeds_a_new_folder_or_names_what_to_keep(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "p1"))
    for key in [k for k in os.environ if k.startswith("PREFECT_") and "DATABASE" in k]:
        monkeypatch.delenv(key)
    database, template = seed_new_home(None, tmp_path / "cache")  # nothing kept yet: keep this one
    assert database == tmp_path / "p1" / "prefect.db" and template == template_database(tmp_path / "cache")
    keep(_database(tmp_path / "a" / "prefect.db", FRESH), template)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "p2"))
    assert seed_new_home(None, tmp_path / "cache") is None and _rows(tmp_path / "p2" / "prefect.db") == FRESH
    assert seed_new_home(None, tmp_path / "cache") is None  # the folder has its database now


def _api(url: str, path: str, body: dict | None = None):
    req = urllib.request.Request(f"{url}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def _serve(home: Path, monkeypatch) -> fast_start.EmbeddedPrefect:
    monkeypatch.setenv("PREFECT_HOME", str(home))
    home.mkdir(parents=True, exist_ok=True)  # as the command's project set-up does
    server = fast_start.EmbeddedPrefect().launch()
    server.wait_ready()
    return server


@pytest.mark.slow
def test_a_server_on_a_seeded_database_answers_without_the_first_folders_rows(tmp_path, monkeypatch):
    """Two real embedded servers (loopback): the first, on a new database, is kept as the template and then given a
    flow; the second starts on a copy of the template, answers, and has no such flow."""
    for key in [k for k in os.environ if k.startswith("PREFECT_") and k != "PREFECT_HOME"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_API_URL", "-")  # launch() sets it: restored after the test
    cache = tmp_path / "cache"
    first_home = tmp_path / "first" / ".prefect"
    monkeypatch.setenv("PREFECT_HOME", str(first_home))
    migrated = seed_new_home(None, cache)
    assert migrated is not None
    server = _serve(first_home, monkeypatch)
    try:
        assert keep(*migrated)
        _api(server.api_url, "/flows/", {"name": "only-in-the-first-folder"})
        assert not keep(migrated[0], tmp_path / "again.db")  # it holds a flow now: never a template
    finally:
        server.stop()
    second_home = tmp_path / "second" / ".prefect"
    monkeypatch.setenv("PREFECT_HOME", str(second_home))
    assert seed_new_home(None, cache) is None and (second_home / "prefect.db").is_file()
    server = _serve(second_home, monkeypatch)
    try:
        flows = _api(server.api_url, "/flows/filter", {})
        assert [f["name"] for f in flows] == []
        _api(server.api_url, "/flows/", {"name": "second"})
        assert [f["name"] for f in _api(server.api_url, "/flows/filter", {})] == ["second"]
    finally:
        server.stop()


def test_certeval_ups_prefect_home_is_seeded_from_the_cache_folder(tmp_path, monkeypatch):
    from certeval.runtime.options import default_cache_dir
    from certeval.services import local_cluster

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for key in [k for k in os.environ if k.startswith("PREFECT_") and "DATABASE" in k]:
        monkeypatch.delenv(key)
    server = local_cluster.LocalPrefectServer(tmp_path / "up" / "prefect")
    home = Path(server.env()["PREFECT_HOME"])

    def stop_before_the_server(n):  # the start is cut off here: the seeding before it is what is tested
        raise RuntimeError("stop here")

    monkeypatch.setattr(local_cluster, "_free_ports", stop_before_the_server)
    with pytest.raises(RuntimeError, match="stop here"):  # nothing kept yet: Prefect creates its own
        server.start()
    assert not home.exists()
    keep(_database(tmp_path / "a" / "prefect.db", FRESH), template_database(default_cache_dir()))
    with pytest.raises(RuntimeError, match="stop here"):
        server.start()
    assert _rows(home / "prefect.db") == FRESH
