"""A new project folder's Prefect database, copied from a migrated one.

The embedded Prefect server (:mod:`certeval.services.fast_start`) keeps its SQLite database in ``PREFECT_HOME``
(``./.prefect`` by default). In a folder that has none, Prefect creates it and runs every migration at start-up:
about 7 CPU-seconds more than a start on an existing database (11.5 against 4.3, measured on the 2-core machine),
several seconds of a command's start-up there. So the first server start in any folder leaves a copy of its
freshly migrated database in the cache folder, one per Prefect version (``<cache>/prefect-db/<version>/prefect.db``),
and a later first start in another folder begins from a copy of it (``certeval up``'s server too).

A template holds only what Prefect writes before it answers: its migration stamp and its registry of block types
and schemas (:data:`TEMPLATE_TABLES`). A database holding anything else (a flow run, a key Prefect generated) is
never kept as a template, so nothing of one folder reaches another. Only the default database is seeded (with a
Prefect database setting in the environment none is), never over an existing file. This is a cache: any
failure to read or write it leaves the start-up as Prefect does it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

# the only tables a freshly started server's database holds rows in (Prefect 3): a template holds nothing else
TEMPLATE_TABLES = frozenset({"alembic_version", "block_type", "block_schema", "block_schema_reference"})


def project_database(home: str | Path | None = None) -> Path | None:
    """The SQLite file a server with Prefect home ``home`` (default ``$PREFECT_HOME``) uses: ``<home>/prefect.db``;
    None when there is no home or the environment holds any Prefect database setting (a URL, migrations turned
    off, a timeout: a database the user configured is Prefect's business)."""
    if any(key.startswith("PREFECT_") and "DATABASE" in key for key in os.environ):
        return None
    home = home or os.environ.get("PREFECT_HOME")
    return Path(home).expanduser() / "prefect.db" if home else None


def template_database(cache_dir: Path) -> Path | None:
    """Where the migrated database of the installed Prefect is kept; None when Prefect's version is unknown."""
    try:
        version = importlib.metadata.version("prefect")
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(cache_dir) / "prefect-db" / version / "prefect.db"


def seed_new_home(home: str | Path | None, cache_dir: Path) -> tuple[Path, Path] | None:
    """Before a server starts on Prefect home ``home`` (default ``$PREFECT_HOME``): a home without a database gets a
    copy of the kept one. Returns ``(database, template)`` when the server will create and migrate a new database
    that no copy exists of yet (:func:`keep` it once the server answers), else None."""
    database, template = project_database(home), template_database(cache_dir)
    if database is None or template is None or database.exists() or seed(database, template):
        return None
    return database, template


def seed(database: Path, template: Path) -> bool:
    """Copy ``template`` to ``database`` when the folder has no database yet; whether it did."""
    if not template.is_file() or database.exists() or database.with_name(database.name + "-wal").exists():
        return False
    return _checked_copy(template, database, os.link)  # a link: never over a database created meanwhile


def keep(database: Path, template: Path) -> bool:
    """Keep ``database`` (a server on it answers) as the template, unless one is kept already or it holds rows a
    template must not; whether it did. The copy is SQLite's online backup: consistent while the server runs."""
    if template.exists() or not database.is_file():
        return False
    return _checked_copy(database, template, os.replace)  # whole or absent: of two at once, one stays


def _checked_copy(source: Path, target: Path, put: Callable[[Path, Path], None]) -> bool:
    """Back ``source`` up beside ``target``; if the copy holds only what a template may, ``put(copy, target)``."""
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy(source, partial)
        if _foreign_tables(partial):
            return False
        put(partial, target)
        return True
    except (OSError, sqlite3.Error):
        return False
    finally:
        partial.unlink(missing_ok=True)


def _copy(source: Path, target: Path) -> None:
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            dst.close()
    finally:
        src.close()


def _foreign_tables(path: Path) -> list[str]:
    """Tables of ``path`` holding rows a template must not hold (no ``alembic_version`` row counts as one)."""
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        foreign = [t for t in tables if t not in TEMPLATE_TABLES and not t.startswith("sqlite_")
                   and con.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone()]
        if "alembic_version" not in tables or not con.execute("SELECT 1 FROM alembic_version").fetchone():
            foreign.append("alembic_version (empty)")
        return foreign
    finally:
        con.close()
