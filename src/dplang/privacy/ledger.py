"""A persistent privacy-budget ledger (SQLite), private to the data holder.

Datasets are keyed by a *name* the user chooses (CLI ``--dataset NAME``; default the input
file's resolved path), not by the content of the file: a re-encoded, re-ordered or re-sorted
copy of the same records has other bytes, so a content key would silently give it a fresh
budget. The SHA-256 of the content used by each release is kept in the ledger only, so that
:meth:`PrivacyLedger.content_warnings` can tell the data holder when a name's content changed
or when the same bytes were already charged under another name. A copy with other bytes charged
under another name (its own path, by default) gets a fresh budget without any warning: only
one name per dataset protects it (names are resolved by :func:`dplang.release.dataset_key`).

Each dataset may carry a total (ε, δ) budget. Every release is written to the ledger *before*
its output is written (DESIGN.md invariant 6); a release that would take the dataset past its
budget is refused with :class:`BudgetExceeded` and nothing is recorded. Charging runs in one
``BEGIN IMMEDIATE`` transaction (read the spend, check, insert), so two processes charging
the same ledger at once are serialised and can never exceed a budget together.

Composition across releases: releases that carry a zCDP parameter are summed in zCDP and
converted at the budget's δ minus the δ spent by approximate-DP releases that carry no zCDP
parameter; those add their ε by basic composition.

Data-dependent releases (``Guarantee.ex_ante`` False, e.g. the AdaPMixED baseline) have no
differential-privacy guarantee: they are recorded and shown separately, never summed into the
DP total, and a dataset with a budget refuses them (no DP budget can account for them).

Charging is idempotent per ``release_id``. The release pipeline (:mod:`dplang.release`)
identifies a release by everything that determines its output (parameters, data, seed), so
resuming an interrupted run charges nothing new while a new seed is a new charge.

Privacy of the ledger itself: it holds content digests, dataset names, output paths and
release ids (hashes that include the seed), so it is as private as the data. It is created
with mode 600 and never written into any public output.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accounting import rho_to_epsilon
from .guarantees import Guarantee


class BudgetExceeded(RuntimeError):
    """The release would exceed the dataset's privacy budget; nothing was recorded."""


class LedgerError(ValueError):
    """The ledger file cannot be used: a folder, not a dplang (SQLite) ledger, or a path that
    cannot be created (one-line message); nothing was recorded."""


#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
_TABLES = frozenset({"budgets", "releases"})


def check_ledger_path(path: str | Path | None = None) -> Path:
    """The ledger path (``path`` or :func:`default_ledger_path`), checked without creating
    anything: an existing ledger must be a regular, readable and writable SQLite database that
    is empty or holds dplang's tables; a new one must be creatable (no ancestor is a file or
    read-only). Raises :class:`LedgerError` with a one-line message."""
    p = Path(path) if path is not None else default_ledger_path()
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
            tables = _tables(p)
            if tables and not tables >= _TABLES:
                raise LedgerError(f"ledger {p} is an SQLite database but not a dplang ledger "
                                  f"(tables: {', '.join(sorted(tables))})")
        return p
    ancestor = p.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise LedgerError(f"ledger {p} cannot be created: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise LedgerError(f"ledger {p} cannot be created: {ancestor} is not writable")
    return p


def _tables(path: Path) -> set[str]:
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=60)
    except sqlite3.Error as exc:
        raise LedgerError(f"ledger {path} cannot be opened ({exc})") from None
    try:
        return {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"ledger {path} is not a dplang ledger ({exc})") from None
    finally:
        db.close()


@dataclass(frozen=True)
class Spend:
    """What a dataset has spent.

    ``rho``: Σρ of the zCDP releases; ``approx_epsilon``/``approx_delta``: basic composition
    of the DP releases without a zCDP parameter; ``releases``: all releases, data-dependent
    ones included; ``data_dependent``: releases with no ex-ante DP guarantee, with their
    nominal (target) ε and δ summed in ``data_dependent_epsilon``/``_delta`` — these are NOT
    part of any DP total."""

    rho: float
    approx_epsilon: float
    approx_delta: float
    releases: int
    data_dependent: int = 0
    data_dependent_epsilon: float = 0.0
    data_dependent_delta: float = 0.0

    @property
    def dp_releases(self) -> int:
        """Releases with an ex-ante DP guarantee (those the totals cover)."""
        return self.releases - self.data_dependent

    def epsilon_at(self, delta: float) -> float:
        """Total ε of the DP releases at total δ = ``delta`` (inf when ``delta`` ≤ the
        approximate releases' δ). Data-dependent releases are not included."""
        remaining = delta - self.approx_delta
        if self.rho == 0:
            return self.approx_epsilon if remaining >= 0 else float("inf")
        if remaining <= 0:
            return float("inf")
        return rho_to_epsilon(self.rho, remaining) + self.approx_epsilon


def default_ledger_path() -> Path:
    """``$DPLANG_LEDGER`` or the user data directory's ``dplang/ledger.sqlite``."""
    env = os.environ.get("DPLANG_LEDGER")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("dplang")) / "ledger.sqlite"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL, created REAL NOT NULL,
    mechanism TEXT NOT NULL, rho REAL, epsilon REAL NOT NULL, delta REAL NOT NULL,
    guarantee TEXT NOT NULL, description TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset);
"""
#: Columns added after the first release of the ledger format (migrated in place).
_ADDED_COLUMNS = {
    "ex_ante": "INTEGER NOT NULL DEFAULT 1",
    "data_digest": "TEXT",
}


def _create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 600 (from creation: no window with wider rights)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class PrivacyLedger:
    """Persistent record of budgets and releases (one SQLite file, mode 600)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = check_ledger_path(path)
        try:
            _create_private_file(self.path)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path} cannot be created ({exc.strerror})") from None
        with self._connect() as db:
            db.executescript(_SCHEMA)
            self._migrate(db)

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        columns = {row[1] for row in db.execute("PRAGMA table_info(releases)")}
        if set(_ADDED_COLUMNS) <= columns:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            columns = {row[1] for row in db.execute("PRAGMA table_info(releases)")}
            for name, decl in _ADDED_COLUMNS.items():
                if name not in columns:
                    db.execute(f"ALTER TABLE releases ADD COLUMN {name} {decl}")
            for release_id, text in db.execute(
                    "SELECT release_id, guarantee FROM releases").fetchall():
                if not json.loads(text).get("ex_ante", True):
                    db.execute("UPDATE releases SET ex_ante = 0 WHERE release_id = ?",
                               (release_id,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection; an SQLite failure (a corrupt or foreign file, a full disk) becomes a
        one-line :class:`LedgerError`."""
        try:
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
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

    def set_budget(self, dataset: str, epsilon: float, delta: float) -> None:
        """Set (or replace) a dataset's total (ε, δ) budget. Refused below what is spent.

        The budget bounds the DP releases only; data-dependent releases already recorded stay
        outside it (``dplang ledger show`` flags them)."""
        if not epsilon > 0 or not 0 < delta < 1:
            raise ValueError("a budget needs epsilon > 0 and delta in (0, 1)")
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                spent = self._spent(db, dataset)
                if spent.dp_releases and spent.epsilon_at(delta) > epsilon:
                    raise BudgetExceeded(
                        f"dataset {dataset} has already spent ε={spent.epsilon_at(delta):.4g} "
                        f"at δ={delta:g}; a budget of ε={epsilon:g} is below that"
                    )
                db.execute(
                    "INSERT OR REPLACE INTO budgets VALUES (?, ?, ?, ?)",
                    (dataset, float(epsilon), float(delta), time.time()),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def budget(self, dataset: str) -> tuple[float, float] | None:
        """The dataset's (ε, δ) budget, or None when none was set."""
        with self._connect() as db:
            row = db.execute(
                "SELECT epsilon, delta FROM budgets WHERE dataset = ?", (dataset,)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def spent(self, dataset: str) -> Spend:
        with self._connect() as db:
            return self._spent(db, dataset)

    @staticmethod
    def _spent(db: sqlite3.Connection, dataset: str) -> Spend:
        rows = db.execute(
            "SELECT rho, epsilon, delta, ex_ante FROM releases WHERE dataset = ?", (dataset,)
        ).fetchall()
        dp = [r for r in rows if r[3]]
        dd = [r for r in rows if not r[3]]
        rho = sum(r[0] for r in dp if r[0] is not None)
        eps = sum(r[1] for r in dp if r[0] is None)
        dlt = sum(r[2] for r in dp if r[0] is None)
        return Spend(rho, eps, dlt, len(rows), len(dd), sum(r[1] for r in dd),
                     sum(r[2] for r in dd))

    def has_release(self, release_id: str) -> bool:
        with self._connect() as db:
            row = db.execute(
                "SELECT 1 FROM releases WHERE release_id = ?", (release_id,)
            ).fetchone()
        return row is not None

    def content_warnings(self, dataset: str, data_digest: str) -> list[str]:
        """Warnings for the data holder before charging ``dataset`` with content
        ``data_digest``: the name's last release used other content, or these exact bytes
        were already charged under other names (whose budgets are then not shared).

        Privacy: the warnings compare private digests and are meant for the data holder's
        terminal only (never for a public file); they reveal that the content changed, not
        how."""
        with self._connect() as db:
            last = db.execute(
                "SELECT data_digest FROM releases WHERE dataset = ? AND data_digest IS NOT NULL "
                "ORDER BY created DESC LIMIT 1", (dataset,)
            ).fetchone()
            others = [r[0] for r in db.execute(
                "SELECT DISTINCT dataset FROM releases WHERE data_digest = ? AND dataset != ? "
                "ORDER BY dataset", (data_digest, dataset))]
        warnings = []
        if last is not None and last[0] != data_digest:
            warnings.append(f"dataset {dataset!r} had other content at its last release; the "
                            "charge still goes to its budget (use another --dataset name if "
                            "this is really other data)")
        if others:
            names = ", ".join(repr(o) for o in others)
            warnings.append(f"the same file content was already charged as dataset {names}; "
                            f"{dataset!r} keeps its own budget (pass --dataset {others[0]} to "
                            "share one)")
        return warnings

    def charge(
        self, dataset: str, release_id: str, guarantee: Guarantee, description: str = "",
        data_digest: str | None = None,
    ) -> bool:
        """Record a release before its output is written.

        Returns False (and charges nothing) when ``release_id`` is already recorded, True when
        it was recorded now. Raises :class:`BudgetExceeded` when the dataset has a budget and
        this release would exceed it, or when it has a budget and the release is
        data-dependent (no ex-ante DP guarantee); then nothing is recorded.
        """
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                exists = db.execute(
                    "SELECT 1 FROM releases WHERE release_id = ?", (release_id,)
                ).fetchone()
                if exists:
                    db.execute("COMMIT")
                    return False
                budget = db.execute(
                    "SELECT epsilon, delta FROM budgets WHERE dataset = ?", (dataset,)
                ).fetchone()
                if budget is not None and not guarantee.ex_ante:
                    raise BudgetExceeded(
                        f"release refused: dataset {dataset} has a differential-privacy "
                        f"budget and this {guarantee.mechanism} release has only a "
                        "data-dependent bound (not differential privacy), which no DP budget "
                        "can account for"
                    )
                if budget is not None:
                    before = self._spent(db, dataset)
                    if guarantee.rho is not None:
                        after = Spend(before.rho + guarantee.rho, before.approx_epsilon,
                                      before.approx_delta, before.releases + 1)
                    else:
                        after = Spend(before.rho, before.approx_epsilon + guarantee.epsilon,
                                      before.approx_delta + guarantee.delta, before.releases + 1)
                    total = after.epsilon_at(budget[1])
                    if total > budget[0] * (1 + 1e-12):
                        raise BudgetExceeded(
                            f"release refused: dataset {dataset} would spend ε={total:.4g} at "
                            f"δ={budget[1]:g}, over its budget ε={budget[0]:g}"
                        )
                db.execute(
                    "INSERT INTO releases (release_id, dataset, created, mechanism, rho, "
                    "epsilon, delta, guarantee, description, ex_ante, data_digest) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (release_id, dataset, time.time(), guarantee.mechanism, guarantee.rho,
                     guarantee.epsilon, guarantee.delta, guarantee.to_json(), description,
                     int(bool(guarantee.ex_ante)), data_digest),
                )
                db.execute("COMMIT")
                return True
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def datasets(self) -> list[str]:
        """Every dataset name with a budget or a release, sorted."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT dataset FROM budgets UNION SELECT dataset FROM releases ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    def releases(self, dataset: str) -> list[dict[str, Any]]:
        """All recorded releases of a dataset, oldest first: ``release_id``, ``created``,
        ``guarantee`` (dict), ``description``, ``ex_ante`` and ``data_digest``."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT release_id, created, guarantee, description, ex_ante, data_digest "
                "FROM releases WHERE dataset = ? ORDER BY created", (dataset,)
            ).fetchall()
        return [
            {"release_id": r[0], "created": r[1], "guarantee": json.loads(r[2]),
             "description": r[3], "ex_ante": bool(r[4]), "data_digest": r[5]}
            for r in rows
        ]

    def release(self, release_id: str) -> dict[str, Any] | None:
        """One recorded release (as in :meth:`releases`, plus ``dataset``), or None."""
        with self._connect() as db:
            r = db.execute(
                "SELECT release_id, created, guarantee, description, ex_ante, data_digest, "
                "dataset FROM releases WHERE release_id = ?", (release_id,)
            ).fetchone()
        if r is None:
            return None
        return {"release_id": r[0], "created": r[1], "guarantee": json.loads(r[2]),
                "description": r[3], "ex_ante": bool(r[4]), "data_digest": r[5],
                "dataset": r[6]}
