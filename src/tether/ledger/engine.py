"""Opening the database: SQLite set-up on every connection, PostgreSQL by URL."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import stat
import urllib.parse
import weakref
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from .. import config
from ..errors import ConfigError, DatabaseUnavailable, LedgerFault
from . import clean_dirs as clean_dirs  # its table in the metadata, for create_all
from . import faults, statuscheck, targets
from .catalogue import catalogue_for
from .ledgerfile import missing_file, no_table, not_a_file
from .schema import RETIRED_INDEXES, STATUS_CHECK_SQL, TABLE, metadata
from .url import mask_url, parse_url

Durability = Literal["full", "normal"]

# Filesystems on which SQLite's locking cannot be trusted across machines.
_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs", "glusterfs", "ceph"}

READ_ONLY = {"tether_read_only": True}
"""Execution options for read transactions: on SQLite they start deferred so they never wait
behind a writer (WAL readers see the last commit)."""


_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_schemas: weakref.WeakKeyDictionary[sa.Engine, str | None] = weakref.WeakKeyDictionary()


def schema_of(engine: sa.Engine) -> str | None:
    """The PostgreSQL schema an engine's ledger lives in (None: the default search path)."""
    return _schemas.get(engine)


def ledger_name(engine: sa.Engine) -> str:
    """The ledger as messages name it: a SQLite file's path, or the URL with its password masked."""
    return (engine.url.database or "") if engine.dialect.name == "sqlite" else mask_url(engine.url)


def ledger_url(engine: sa.Engine) -> str:
    """The ledger's URL as it may be printed: the plain scheme a user writes (``postgresql://``,
    not the driver's), a SQLite file's absolute path, the password masked."""
    return mask_url(engine.url.set(drivername=engine.url.get_backend_name()))


def create_engine(
    url: str,
    *,
    durability: Durability = "full",
    busy_timeout: float = config.BUSY_TIMEOUT,
    schema: str | None = None,
    create: bool = True,
) -> sa.Engine:
    """An engine for ``url``; SQLite files (and their directory) are created when missing, a new
    file whole with its table, unless ``create`` is false (then a missing file is NoLedger); an
    empty (0-byte) one is refused as a LedgerFault. ``schema`` (PostgreSQL) keeps the ledger in
    its own schema of a shared database."""
    if durability not in ("full", "normal"):
        raise ConfigError(f"durability must be 'full' or 'normal', not {durability!r}")
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        if schema is not None:
            raise ConfigError("schema applies to PostgreSQL only: a SQLite ledger is its own file, use another file")
        return _sqlite_engine(parsed, durability, busy_timeout, create)
    parsed = parsed.set(drivername="postgresql+psycopg")
    # No JIT compilation: every statement tether sends is short and walks an index, while the
    # planner's cost of a claim on a large or freshly analyzed table passes jit_above_cost, and
    # compiling it then takes longer than the claim runs. The session runs in UTC, the ledger's
    # own zone, as on SQLite: psycopg reads a time of a UTC session with a fixed offset, and one
    # of any named zone (a server's default Etc/UTC too) through zoneinfo, far dearer, and a
    # claimed job carries four times (benchmarks/README.md). Options the URL gives come after,
    # so the user's word (their own jit, time zone, search_path) stands.
    options = " ".join(["-cjit=off", "-ctimezone=UTC", *_as_list(parsed.query.get("options"))])
    if schema is not None:
        if not _IDENTIFIER.match(schema):
            raise ConfigError(f"schema {schema!r} is not a plain identifier (lowercase letters, digits, _; at most 63)")
        # Only this schema on the search path: with public on it too, the table check could
        # find another application's public.tether_jobs and use it.
        options += f" -csearch_path={schema}"
    connect_args = {"options": options}
    engine = sa.create_engine(parsed, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args)
    _schemas[engine] = schema
    return engine


def _as_list(value: str | tuple[str, ...] | None) -> list[str]:
    """A URL query value (absent, once, or repeated) as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _sqlite_engine(url: sa.URL, durability: Durability, busy_timeout: float, create: bool) -> sa.Engine:
    database = url.database
    if not database or database == ":memory:":
        raise ConfigError(
            "tether needs a SQLite file (sqlite:///path/to/tether.db): an in-memory database "
            "is lost with the process and cannot be shared by a worker"
        )
    path = Path(database).expanduser().absolute()
    if not create and not path.exists():
        raise missing_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseUnavailable(f"cannot create the directory of {path}: {e.strerror}") from e
    fs = _filesystem_type(path.parent)
    if fs in _NETWORK_FS:
        raise ConfigError(
            f"{path} is on a {fs} network filesystem, where SQLite's locks are unreliable and "
            "the ledger can be corrupted; keep the SQLite file on a local disk, or use PostgreSQL "
            "to share the ledger between machines"
        )
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise DatabaseUnavailable(f"cannot open the ledger file {path}: {e.strerror}") from e
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise not_a_file(path, st.st_mode)  # SQLite's first read of a FIFO would block
    size = None if st is None else st.st_size
    if size == 0:
        # SQLite would take an empty file for a new database and tether would fill it with an
        # empty ledger: the jobs that were in it would be gone without a word.
        raise LedgerFault(
            faults.CORRUPT,
            f"the ledger file {path} is empty (0 bytes): it was truncated, or something other than "
            "tether created it; tether creates a new ledger only where no file exists. Restore it "
            "from a backup, or remove it to start an empty ledger",
        )
    if size is None:
        if not create:  # gone since the check above
            raise missing_file(path)
        _create_sqlite_ledger(url, path, durability, busy_timeout)
    return _sqlite_engine_at(url, path, durability, busy_timeout)


def _create_sqlite_ledger(url: sa.URL, path: Path, durability: Durability, busy_timeout: float) -> None:
    """Make a new ledger at ``path`` whole before it appears: built under a temporary name and
    linked into place, so no process ever finds tether's ledger empty (and an empty file at
    the path always means one was lost). A process that links first wins; the others use its."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tether-new")
    engine = _sqlite_engine_at(url, temp, durability, busy_timeout, new=True)
    try:
        ensure_schema(engine)
    finally:
        engine.dispose()  # the last connection checkpoints and removes the temp WAL
    try:
        os.link(temp, path)
    except FileExistsError:
        pass  # another process created it meanwhile
    except OSError:
        # A filesystem without hard links: SQLite creates the file in place, as it always did.
        pass
    else:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        for leftover in (temp, temp.with_name(temp.name + "-wal"), temp.with_name(temp.name + "-shm")):
            leftover.unlink(missing_ok=True)


def _sqlite_engine_at(
    url: sa.URL, path: Path, durability: Durability, busy_timeout: float, *, new: bool = False
) -> sa.Engine:
    # A ledger that exists is opened read-write only (``mode=rw``): a connection made after its
    # file was deleted fails, where SQLite would create an empty file in its place and the
    # worker holding the old one would take the loss for a replacement. Only a new ledger,
    # built under its temporary name, is created by its first connection.
    target = f"file:{urllib.parse.quote(str(path))}{'' if new else '?mode=rw'}"

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(target, uri=True, timeout=busy_timeout, check_same_thread=False, isolation_level=None)
        if new:
            return conn
        try:
            size = path.stat().st_size
        except OSError as e:
            # Removed between SQLite's open and this look: the database error a connection to a
            # removed ledger raises (callers handle those), not an OSError none of them expects.
            conn.close()
            raise sqlite3.OperationalError(f"the ledger file {path}: {e.strerror}") from None
        if size == 0:
            # Emptied under the process: the connect-time PRAGMAs would wait out the busy
            # timeout on the other connections' locks before failing.
            conn.close()
            raise sqlite3.OperationalError(f"the ledger file {path} is empty (0 bytes)")
        return conn

    engine = sa.create_engine(url.set(database=str(path)), creator=connect, pool_size=8, max_overflow=32)
    synchronous = "FULL" if durability == "full" else "NORMAL"

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        # A batch's claim and its group completion each keep a statement journal of the pages
        # they change (100-300 KB); SQLite spills those past 64 KB to a temp file it creates,
        # writes and deletes on disk, twice per batch. Kept in memory instead.
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that later upgrades can
        # fail with "database is locked" without waiting for the busy timeout.
        if conn.get_execution_options().get("tether_read_only"):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _filesystem_type(directory: Path) -> str | None:
    """The filesystem type of ``directory`` from /proc/mounts (Linux), or None if unknown."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(directory)
    best, best_type = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) > len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def _index_names(conn: sa.Connection, dialect: str, table: str = TABLE) -> set[str]:
    if dialect == "postgresql":
        query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = :table"
    else:
        query = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :table"
    return set(conn.execute(sa.text(query), {"table": table}).scalars())


def _column_names(conn: sa.Connection, dialect: str, table: str) -> set[str]:
    if dialect == "postgresql":
        query = (
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = :table"
        )
        return set(conn.execute(sa.text(query), {"table": table}).scalars())
    return {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}


# Filled when the column is added to an existing ledger, for the jobs that may still run (a
# failed one may be retried): finished rows are left as they are, so the upgrade stays short.
# (table, column) -> (value per dialect, rows to fill). ``blocked`` is set after the indexes
# (BLOCK_WAITING in statements/sqlite.sql reads the waiting jobs through one).
_FILL = {
    (TABLE, "payload_bytes"): (
        {"sqlite": "length(CAST(payload AS BLOB))", "postgresql": "octet_length(payload)"},  # bytes, not characters
        "status IN ('pending', 'claimed', 'failed')",
    ),
}


def _add_missing_columns(conn: sa.Connection, dialect: sa.Dialect) -> set[str]:
    """Columns added since a ledger was created (nullable, or with a constant default): added in
    place, no rewrite. Returns the ``table.column`` names added."""
    added = set()
    for table in metadata.sorted_tables:
        present = _column_names(conn, dialect.name, table.name)
        for column in table.columns:
            if column.name not in present:
                kind = column.type.compile(dialect=dialect)
                if not column.nullable:
                    default = column.server_default
                    if not isinstance(default, sa.DefaultClause):
                        raise DatabaseUnavailable(f"cannot upgrade {table.name}: new column {column.name} is required")
                    constant = sa.literal_column(str(default.arg)) if isinstance(default.arg, str) else default.arg
                    kind += f" DEFAULT {constant.compile(dialect=dialect)} NOT NULL"
                conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}")
                if (table.name, column.name) in _FILL:
                    value, rows = _FILL[table.name, column.name]
                    conn.exec_driver_sql(f"UPDATE {table.name} SET {column.name} = {value[dialect.name]} WHERE {rows}")
                added.add(f"{table.name}.{column.name}")
    return added


def layout() -> str:
    """A digest of what ``ensure_schema`` checks a ledger for: each table's column names and
    index names, the retired indexes it drops, the triggers it creates and the status CHECK.
    Recorded in ``tether_meta`` once a ledger has them all, so an open that finds it current skips
    the inspection (``meta.settled``)."""
    global _layout
    if _layout is None:
        parts = [
            f"{t.name}({','.join(c.name for c in t.columns)})[{','.join(sorted(i.name or '' for i in t.indexes))}]"
            for t in metadata.sorted_tables
        ]
        parts.append("-" + ",".join(RETIRED_INDEXES))
        parts.append("+" + ",".join(targets.TRIGGERS))  # the triggers that keep tether_targets
        parts.append(STATUS_CHECK_SQL)  # the status CHECK, its statuses and spelling (statuscheck.py)
        _layout = hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]
    return _layout


_layout: str | None = None


def ensure_schema(engine: sa.Engine) -> bool:
    """Create the jobs table and any of its columns, indexes and triggers that are missing, drop
    the indexes earlier versions used instead; safe to run from many workers at once. True when
    this call created the ledger (its jobs table did not exist)."""
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                schema = schema_of(engine)
                # Serialise concurrent creators of this ledger; the lock ends with the transaction.
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"tether:{schema or ''}"})
                if schema:
                    conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            created = not sa.inspect(conn).has_table(TABLE)
            metadata.create_all(conn, checkfirst=True)
            added = _add_missing_columns(conn, engine.dialect)
            if not created:
                statuscheck.widen(conn, engine.dialect)
            # create_all builds indexes only with a table it creates: a ledger from an earlier
            # version gets the indexes added since here. Only missing ones: on PostgreSQL even
            # CREATE INDEX IF NOT EXISTS locks the table against writers first.
            present = _index_names(conn, engine.dialect.name)
            for table in metadata.sorted_tables:
                on_table = present if table.name == TABLE else _index_names(conn, engine.dialect.name, table.name)
                for index in table.indexes:
                    if index.name not in on_table:
                        conn.execute(sa.schema.CreateIndex(index))
            for name in RETIRED_INDEXES:
                if name in present:
                    conn.exec_driver_sql(f"DROP INDEX {name}")
            sql = catalogue_for(engine.dialect.name)
            if f"{TABLE}.blocked" in added:  # the waiting jobs of a ledger from before the flag
                conn.exec_driver_sql(sql.BLOCK_WAITING)
            targets.ensure(conn, sql)  # after the indexes: its fill reads ix_tether_jobs_on_target
            return created
    except sa.exc.SQLAlchemyError as e:
        raise opening_error(engine, e) from e


def require_ledger(engine: sa.Engine) -> None:
    """NoLedger unless the database holds tether's jobs table: what an open that must not create
    a ledger checks before it would create one."""
    try:
        with engine.connect() as conn:
            present = sa.inspect(conn).has_table(TABLE)
    except sa.exc.SQLAlchemyError as e:
        raise opening_error(engine, e) from e
    if not present:
        raise no_table(mask_url(engine.url), schema_of(engine))


def opening_error(engine: sa.Engine, e: sa.exc.SQLAlchemyError) -> Exception:
    """What to raise for a database error met while opening a ledger: a LedgerFault (fatal), a
    DatabaseUnavailable (retry later), or the error itself when it is neither."""
    fault = faults.ledger_fault(e, ledger_name(engine))
    if fault is not None:
        return fault
    if not isinstance(e, sa.exc.OperationalError):
        return e
    reason = " ".join(str(e.orig).split())  # drivers' messages span lines; ours are one
    return DatabaseUnavailable(f"cannot open the database at {mask_url(engine.url)}: {reason}")
