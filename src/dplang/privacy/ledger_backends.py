"""Where a :class:`~dplang.privacy.ledger.PrivacyLedger` lives: an SQLite file (the embedded
default) or a PostgreSQL database named by a ``postgresql://`` (or ``postgres://``) URL, for a
dataset whose budget several analysts or machines spend (an SQLite file on a shared disk is not
safe: network file systems do not honour its locks).

The ledger's consistency argument — read the spend, check the budget, insert the release, in
one transaction — is in :mod:`dplang.privacy.ledger`; it relies on one property of this module:

    Every :meth:`LedgerBackend.write` transaction for a key (a dataset name) is serialised with
    every other one for the same key, on every machine that uses the same ledger: it starts
    only after the previous one committed or rolled back, and its reads see what that one
    committed.

* SQLite: ``BEGIN IMMEDIATE`` takes the file's write lock (for every key at once) before the
  first read; another writer waits for it (60 s at most, then a one-line error).
* PostgreSQL: ``BEGIN ISOLATION LEVEL READ COMMITTED``, then
  ``pg_advisory_xact_lock(key)`` with 64 bits of the SHA-256 of the key: a transaction for the
  same key waits at that lock (60 s at most: ``lock_timeout``) until this one ends, and then,
  each statement of a read-committed transaction taking a fresh snapshot, reads what it
  committed. (REPEATABLE READ or SERIALIZABLE would be wrong here: they take their snapshot at
  the first statement — the lock itself, before the wait — and would read a stale spend.)
  Isolation is set explicitly, whatever the server's ``default_transaction_isolation``.

Both backends hold the same tables and columns (:data:`SCHEMA`; PostgreSQL's ``REAL`` is single
precision, so it gets ``DOUBLE PRECISION``, the 8-byte float that SQLite's ``REAL`` is). SQL
is written once, with ``?`` placeholders (translated to psycopg's ``%s``) and no literal ``?``
or ``%``.

Errors: anything that makes the ledger unusable — a bad file, a server that cannot be reached,
a refused login, psycopg not installed, a lock held too long — is a one-line
:class:`LedgerError`. A URL's password is never printed: messages name the ledger by
:func:`mask_url` (``postgresql://user:***@host/db``) and any copy of the password in a server
or driver message is blanked.

Privacy: a PostgreSQL ledger holds what the file does (content digests, dataset names, output
paths, release ids that hash the seed): the database is as private as the data. dplang cannot
set its access rights (a file is created with mode 600): grant them to the data holders only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote


class LedgerError(ValueError):
    """The ledger cannot be used: a folder or a file that is not a dplang (SQLite) ledger, a
    path that cannot be created, a PostgreSQL server that cannot be reached or refuses the
    login, psycopg missing (one-line message, no password); nothing was recorded."""


#: The ledger's tables and columns, the same in both backends (``{real}``: the 8-byte float
#: type). ``release_id`` is the primary key: charging is idempotent per release id.
SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset TEXT PRIMARY KEY, epsilon {real} NOT NULL, delta {real} NOT NULL,
    created {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL, created {real} NOT NULL,
    mechanism TEXT NOT NULL, rho {real}, epsilon {real} NOT NULL, delta {real} NOT NULL,
    guarantee TEXT NOT NULL, description TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset);
"""
#: Columns added after the first release of the ledger format (migrated in place).
ADDED_COLUMNS = {
    "ex_ante": "INTEGER NOT NULL DEFAULT 1",
    "data_digest": "TEXT",
    # H(dataset, seed) of the release's seed (None for toy runs and older releases): a seed is
    # refused for a second release of the same dataset (privacy/ledger.py, SeedReused)
    "seed_tag": "TEXT",
}
TABLES = frozenset({"budgets", "releases"})
#: The columns every dplang ledger has had, per table.
BASE_COLUMNS = {
    "budgets": frozenset({"dataset", "epsilon", "delta", "created"}),
    "releases": frozenset({"release_id", "dataset", "created", "mechanism", "rho", "epsilon",
                           "delta", "guarantee", "description"}),
}
#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
#: How long a charge waits for another process's transaction before giving up.
LOCK_TIMEOUT_S = 60
#: SQLite: the slice of that wait after which Python looks for a signal (Ctrl-C).
LOCK_WAIT_SLICE_MS = 200
#: PostgreSQL: how long a charge's transaction may sit idle between its statements (they
#: follow each other within milliseconds) before the server ends the session, rolling the
#: charge back and releasing the dataset's lock: a client cut off the network or stopped
#: mid-charge would otherwise hold it until the server notices the dead connection (TCP
#: keepalive: hours by default), and every charge of the dataset would fail meanwhile.
IDLE_IN_CHARGE_S = 30
_URL_SCHEMES = ("postgresql://", "postgres://")
PG_EXTRA = "postgres"


class Cursor(Protocol):
    """What :meth:`Db.execute` returns (sqlite3's and psycopg's cursors both are one)."""

    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Db(Protocol):
    """A connection: ``execute(sql, params)`` with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Cursor: ...


def is_ledger_url(location: str | os.PathLike[str] | None) -> bool:
    """Whether ``location`` names a PostgreSQL ledger (a ``postgresql://`` or ``postgres://``
    URL, given as a str)."""
    return isinstance(location, str) and location.strip().lower().startswith(_URL_SCHEMES)


#: ``scheme://user:`` and what follows up to the *last* ``@``: libpq reads a URL's password up
#: to the first ``@`` (``?`` and ``#`` are ordinary characters of it); up to the last one, an
#: unencoded ``@`` or ``/`` in a password (which libpq then misreads) is masked whole too.
_URL_AUTH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:/+[^:@/]*):(.*)@")
#: ``password=`` and ``sslpassword=`` (the client key's passphrase) query parameters: a value
#: runs to the next ``&``.
_URL_QUERY_SECRET = re.compile(r"(?i)([?&](?:ssl)?password=)([^&]*)")


def mask_url(url: str) -> str:
    """``url`` with its password (``user:PASSWORD@``, ``?password=...``, ``?sslpassword=...``)
    replaced by ``***``: the only form of a ledger URL dplang prints or writes. Errs on the side
    of masking more (everything up to the last ``@`` after ``user:``)."""
    url = _URL_AUTH.sub(r"\1:***@", url.strip(), count=1)
    return _URL_QUERY_SECRET.sub(r"\1***", url)


def ledger_location(location: str | os.PathLike[str] | None) -> str | Path:
    """A ledger location as dplang keeps it: a PostgreSQL URL as the str given, anything else
    as a file :class:`Path`; None means ``$DPLANG_LEDGER`` (which may be a URL) or the user
    data directory's ``dplang/ledger.sqlite``.

    A URL turned into a :class:`Path` has lost a ``/`` of its ``//`` and can no longer be
    told from a file name; it is refused (:class:`LedgerError`) rather than taken for a
    file."""
    if location is None:
        env = os.environ.get("DPLANG_LEDGER")
        if env:
            return ledger_location(env)
        from platformdirs import user_data_dir

        return Path(user_data_dir("dplang")) / "ledger.sqlite"
    if is_ledger_url(location):
        return str(location).strip()
    text = os.fspath(location)
    if re.match(r"(?i)^postgres(ql)?:/[^/]", text):
        raise LedgerError(f"ledger {mask_url(text)} looks like a PostgreSQL URL that lost a "
                          "'/' (made into a file path): pass it as a str, "
                          "postgresql://user@host/dbname")
    return Path(location)


def backend_for(location: str | os.PathLike[str] | None) -> LedgerBackend:
    """The backend of a ledger location (:func:`ledger_location`)."""
    where = ledger_location(location)
    if isinstance(where, str):
        return PostgresBackend(where)
    return SQLiteBackend(where)


def schema_statements(real: str) -> list[str]:
    """:data:`SCHEMA` as single statements, with ``real`` the 8-byte float type."""
    return [s.strip() for s in SCHEMA.format(real=real).split(";") if s.strip()]


class LedgerBackend(ABC):
    """One ledger's SQL connection and dialect (see the module docstring for the contract of
    :meth:`write`)."""

    #: How the ledger is named in messages and private files (a URL's password masked).
    location: str
    #: The ledger file (None for a database server).
    path: Path | None = None
    #: The 8-byte floating-point column type.
    real: str = "REAL"

    @abstractmethod
    def check(self) -> None:
        """Check the ledger can be used, without creating anything (:class:`LedgerError`)."""

    @abstractmethod
    def prepare(self) -> None:
        """Check, and create what must exist before the schema (the SQLite file, mode 600)."""

    @abstractmethod
    def connect(self) -> Any:
        """A context manager giving a :class:`Db` in autocommit mode; a driver error inside
        becomes a one-line :class:`LedgerError` (other exceptions pass through)."""

    @abstractmethod
    def write(self, key: str) -> Any:
        """A context manager giving a :class:`Db` inside a transaction serialised with every
        other ``write(key)`` of this ledger; committed when the block ends normally, rolled
        back when it raises."""

    @abstractmethod
    def columns(self, db: Db) -> dict[str, set[str]]:
        """The ledger tables that exist and their columns."""


# --- SQLite -------------------------------------------------------------------------------


class SQLiteBackend(LedgerBackend):
    """A ledger file (SQLite 3), created with mode 600; the embedded default."""

    real = "REAL"

    def __init__(self, path: Path) -> None:
        self.file = path
        self.path = path
        self.location = str(path)

    def check(self) -> None:
        """An existing ledger must be a regular, readable and writable SQLite database that is
        empty or holds dplang's tables; a new one must be creatable (no ancestor is a file or
        read-only)."""
        p = self.file
        if os.path.lexists(p):
            if p.is_dir():
                raise LedgerError(f"ledger {p} is a folder, not a ledger file")
            try:
                with open(p, "rb") as fh:
                    head = fh.read(len(SQLITE_MAGIC))
            except OSError as exc:
                raise LedgerError(f"ledger {p} cannot be read ({exc.strerror})") from None
            if head and head != SQLITE_MAGIC:
                raise LedgerError(f"ledger {p} is not a dplang ledger (not an SQLite database)")
            if not os.access(p, os.W_OK):
                raise LedgerError(f"ledger {p} is not writable")
            if head:
                tables = _sqlite_tables(p)
                if tables and not tables >= TABLES:
                    raise LedgerError(f"ledger {p} is an SQLite database but not a dplang "
                                      f"ledger (tables: {', '.join(sorted(tables))})")
            return
        ancestor = p.parent
        while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise LedgerError(f"ledger {p} cannot be created: {ancestor} is a file, not a folder")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise LedgerError(f"ledger {p} cannot be created: {ancestor} is not writable")

    def prepare(self) -> None:
        self.check()
        try:
            _create_private_file(self.file)
        except OSError as exc:
            raise LedgerError(f"ledger {self.file} cannot be created ({exc.strerror})") from None

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection; an SQLite failure (a corrupt or foreign file, a full disk, a lock held
        past the timeout) becomes a one-line :class:`LedgerError`."""
        try:
            db = sqlite3.connect(self.file, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} cannot be opened ({exc})") from None
        try:
            yield db
        except sqlite3.OperationalError as exc:  # locked past the timeout, disk full...
            raise LedgerError(f"ledger {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"ledger {self.path} is not a usable dplang ledger ({exc})"
                              ) from None
        finally:
            db.close()

    @contextmanager
    def write(self, key: str) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: the file's write lock, taken before the first read."""
        with self.connect() as db:
            _begin_immediate(db)
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def columns(self, db: Db) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for table in sorted(TABLES):
            cols = {row[1] for row in db.execute(f"PRAGMA table_info({table})").fetchall()}
            if cols:
                out[table] = cols
        return out


def _begin_immediate(db: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, waiting up to :data:`LOCK_TIMEOUT_S` for another writer, in slices
    of :data:`LOCK_WAIT_SLICE_MS`: SQLite's own busy wait runs in C, where Python sees no
    signal, so a Ctrl-C during one 60-second wait went unseen until it ended. Between two
    slices Python runs its signal handlers, and a Ctrl-C stops the wait at once."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    db.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_SLICE_MS}")
    try:
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
    finally:  # COMMIT may wait for readers too: the full timeout again
        db.execute(f"PRAGMA busy_timeout = {LOCK_TIMEOUT_S * 1000}")


def _sqlite_tables(path: Path) -> set[str]:
    """The tables of the SQLite file ``path``, read without writing; a rollback journal left
    by a process killed while it committed (a "hot journal", which a read-only connection
    cannot roll back) is rolled back first, by one read through a writable connection."""
    real = path.resolve()  # SQLite keeps the journal beside the file a link names
    journal = real.with_name(real.name + "-journal")
    if journal.exists() and journal.stat().st_size > 0 and os.access(path, os.W_OK):
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(path, timeout=LOCK_TIMEOUT_S)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                db.close()
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True,
                             timeout=LOCK_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise LedgerError(f"ledger {path} cannot be opened ({exc})") from None
    try:
        return {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if journal.exists():
            raise LedgerError(f"ledger {path} has the rollback journal of a write that was "
                              f"stopped; open it once with write access to {path.parent} to "
                              f"roll it back ({exc})") from None
        raise LedgerError(f"ledger {path} is not a dplang ledger ({exc})") from None
    finally:
        db.close()


def _create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 600 (from creation: no window with wider rights)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


# --- PostgreSQL ---------------------------------------------------------------------------


def advisory_key(key: str) -> int:
    """The signed 64-bit ``pg_advisory_xact_lock`` key of a dataset name (SHA-256, so that the
    same name gives the same key on every machine and Python version)."""
    digest = hashlib.sha256(b"dplang-ledger\x00" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class _PgDb:
    """A psycopg connection with the :class:`Db` interface (``?`` placeholders)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        cursor: Cursor = self.conn.execute(sql.replace("?", "%s"), tuple(params))
        return cursor


def _passwords(url: str) -> list[str]:
    """The secrets written in ``url`` (what :func:`mask_url` masks: ``user:PASSWORD@``,
    ``?password=``, ``?sslpassword=``), as written and percent-decoded, with their pieces
    between ``@ / ? #`` (a password libpq misreads is quoted in pieces, as a host or a port),
    longest first: what to blank out of messages."""
    url = url.strip()
    m = _URL_AUTH.match(url)
    raw = ([m.group(2)] if m else []) + [v for _, v in _URL_QUERY_SECRET.findall(url)]
    pieces = [p for g in raw for p in (g, *re.split(r"[@/?#]", g))]
    return sorted({form for g in pieces for form in (g, unquote(g)) if form}, key=len,
                  reverse=True)


class PostgresBackend(LedgerBackend):
    """A ledger in a PostgreSQL database (psycopg 3; ``pip install 'dplang[postgres]'``),
    for a budget that several analysts or machines spend."""

    real = "DOUBLE PRECISION"

    def __init__(self, url: str) -> None:
        self.url = url
        self.location = mask_url(url)
        self.path = None

    def _clean(self, exc: BaseException) -> str:
        """The driver's message on one line (a server error's primary message, without the
        statement it quotes), any copy of the password blanked."""
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag is not None else None
        text = " ".join((primary or str(exc)).split()) or type(exc).__name__
        for secret in _passwords(self.url):
            text = text.replace(secret, "***")
        return text

    def _psycopg(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise LedgerError(
                f"ledger {self.location} is a PostgreSQL database, which needs psycopg: "
                f"pip install 'dplang[{PG_EXTRA}]'") from None
        return psycopg

    def _open(self) -> Any:
        psycopg = self._psycopg()
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.url)
        except psycopg.Error as exc:
            raise LedgerError(f"ledger {self.location} is not a valid PostgreSQL URL "
                              f"({self._clean(exc)})") from None
        extra: dict[str, Any] = {}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = 10
        if "application_name" not in params:
            extra["application_name"] = "dplang"
        try:
            conn = psycopg.connect(self.url, autocommit=True, **extra)
        except psycopg.OperationalError as exc:
            raise LedgerError(self._connect_message(exc)) from None
        except psycopg.Error as exc:
            raise LedgerError(f"ledger {self.location} cannot be opened "
                              f"({self._clean(exc)})") from None
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn

    def _connect_message(self, exc: BaseException) -> str:
        text = self._clean(exc)
        lowered = text.lower()
        if ("authentication failed" in lowered or "no password supplied" in lowered
                or "pg_hba.conf" in lowered or getattr(exc, "sqlstate", None) in (
                    "28P01", "28000")):
            return f"ledger {self.location}: the PostgreSQL server refused the login ({text})"
        if "does not exist" in lowered:
            return f"ledger {self.location}: {text}"
        return f"ledger {self.location}: the PostgreSQL server cannot be reached ({text})"

    def check(self) -> None:
        """Connect (psycopg installed, server reachable, login accepted) and check that the
        database has both ledger tables with their columns, or neither (a new ledger)."""
        with self.connect() as db:
            existing = self.columns(db)
            if not existing:
                self._check_no_ledger_elsewhere(db)
                return
        missing = sorted(TABLES - set(existing))
        if missing:
            raise LedgerError(f"ledger {self.location} has a table {', '.join(sorted(existing))}"
                              f" but no {', '.join(missing)}: not a dplang ledger")
        for table, cols in existing.items():
            lacking = sorted(BASE_COLUMNS[table] - cols)
            if lacking:
                raise LedgerError(f"ledger {self.location}: table {table} lacks column(s) "
                                  f"{', '.join(lacking)}: not a dplang ledger")

    def _check_no_ledger_elsewhere(self, db: Db) -> None:
        """Before a new ledger is created in this login's current schema: refuse when another
        schema of the database holds one. PostgreSQL's default ``search_path`` is ``"$user",
        public``: an analyst with a schema of their own name would otherwise create, and
        charge, a second ledger beside the team's — two budgets for one dataset."""
        here = db.execute("SELECT current_schema()").fetchone()[0]
        others = sorted({row[0] for row in db.execute(
            "SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND c.relname = ? "
            "AND n.nspname IS DISTINCT FROM current_schema() AND EXISTS (SELECT 1 FROM "
            "pg_catalog.pg_class c2 WHERE c2.relnamespace = n.oid AND c2.relname = ?)",
            ("releases", "budgets")).fetchall()})
        if here is None:
            raise LedgerError(f"ledger {self.location}: no schema of this login's search_path "
                              "exists; set one (e.g. ?options=-csearch_path%3Dpublic)")
        if others:
            names = ", ".join(others)
            raise LedgerError(
                f"ledger {self.location}: schema {names} of this database holds a dplang "
                f"ledger, but this login's current schema is {here}, where a second, separate "
                f"ledger (another budget) would be created; point the URL at it with "
                f"?options=-csearch_path%3D{others[0]} (or use another database for a "
                "separate ledger)")

    def prepare(self) -> None:
        self.check()

    @contextmanager
    def connect(self) -> Iterator[_PgDb]:
        psycopg = self._psycopg()
        conn = self._open()
        try:
            yield _PgDb(conn)
        except psycopg.errors.LockNotAvailable:
            raise LedgerError(f"ledger {self.location}: another process held the dataset's "
                              f"lock for over {LOCK_TIMEOUT_S} s") from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise LedgerError(f"ledger {self.location}: {self._clean(exc)} (the login needs "
                              "SELECT and INSERT on the ledger's tables, UPDATE on budgets, and "
                              "CREATE on the schema until the tables exist)") from None
        except psycopg.Error as exc:
            raise LedgerError(f"ledger {self.location}: {self._clean(exc)}") from None
        finally:
            conn.close()

    @contextmanager
    def write(self, key: str) -> Iterator[_PgDb]:
        """READ COMMITTED transaction holding ``pg_advisory_xact_lock`` of the key."""
        with self.connect() as db, db.conn.transaction():
            db.execute(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT_S)}s'")
            db.execute("SET LOCAL idle_in_transaction_session_timeout = "
                       f"'{int(IDLE_IN_CHARGE_S)}s'")
            db.execute("SELECT pg_advisory_xact_lock(?)", (advisory_key(key),))
            yield db

    def columns(self, db: Db) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for table, column in db.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name IN (?, ?)",
                tuple(sorted(TABLES))).fetchall():
            out.setdefault(table, set()).add(column)
        return out
