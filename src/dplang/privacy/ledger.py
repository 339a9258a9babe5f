"""A persistent privacy-budget ledger (SQLite).

Each *dataset* (identified by a caller-chosen id, usually the hash of the data file) may carry
a total (ε, δ) budget. Every release is written to the ledger *before* its output is written
(DESIGN.md invariant 6); a release that would take the dataset past its budget is refused with
:class:`BudgetExceeded` and nothing is recorded.

Composition across releases: releases that carry a zCDP parameter are summed in zCDP and
converted at the budget's δ minus the δ spent by approximate-DP releases that carry no zCDP
parameter; those add their ε by basic composition. Charging is idempotent per ``release_id``:
resuming an interrupted run charges nothing new.
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

from .accounting import rho_to_epsilon
from .guarantees import Guarantee


class BudgetExceeded(RuntimeError):
    """The release would exceed the dataset's privacy budget; nothing was recorded."""


@dataclass(frozen=True)
class Spend:
    """What a dataset has spent: Σρ of zCDP releases, basic-composition (ε, δ) of the rest."""

    rho: float
    approx_epsilon: float
    approx_delta: float
    releases: int

    def epsilon_at(self, delta: float) -> float:
        """Total ε at total δ = ``delta`` (inf when ``delta`` ≤ the approximate releases' δ)."""
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


class PrivacyLedger:
    """Persistent record of budgets and releases (one SQLite file)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_ledger_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def set_budget(self, dataset: str, epsilon: float, delta: float) -> None:
        """Set (or replace) a dataset's total (ε, δ) budget. Refused below what is spent."""
        if not epsilon > 0 or not 0 < delta < 1:
            raise ValueError("a budget needs epsilon > 0 and delta in (0, 1)")
        spent = self.spent(dataset)
        if spent.releases and spent.epsilon_at(delta) > epsilon:
            raise BudgetExceeded(
                f"dataset {dataset} has already spent ε={spent.epsilon_at(delta):.4g} at "
                f"δ={delta:g}; a budget of ε={epsilon:g} is below that"
            )
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO budgets VALUES (?, ?, ?, ?)",
                (dataset, float(epsilon), float(delta), time.time()),
            )

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
            "SELECT rho, epsilon, delta FROM releases WHERE dataset = ?", (dataset,)
        ).fetchall()
        rho = sum(r[0] for r in rows if r[0] is not None)
        eps = sum(r[1] for r in rows if r[0] is None)
        dlt = sum(r[2] for r in rows if r[0] is None)
        return Spend(rho, eps, dlt, len(rows))

    def has_release(self, release_id: str) -> bool:
        with self._connect() as db:
            row = db.execute(
                "SELECT 1 FROM releases WHERE release_id = ?", (release_id,)
            ).fetchone()
        return row is not None

    def charge(
        self, dataset: str, release_id: str, guarantee: Guarantee, description: str = ""
    ) -> bool:
        """Record a release before its output is written.

        Returns False (and charges nothing) when ``release_id`` is already recorded, True when
        it was recorded now. Raises :class:`BudgetExceeded` when the dataset has a budget and
        this release would exceed it; then nothing is recorded.
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
                    "INSERT INTO releases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (release_id, dataset, time.time(), guarantee.mechanism, guarantee.rho,
                     guarantee.epsilon, guarantee.delta, guarantee.to_json(), description),
                )
                db.execute("COMMIT")
                return True
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def releases(self, dataset: str) -> list[dict[str, object]]:
        """All recorded releases of a dataset, oldest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT release_id, created, guarantee, description FROM releases "
                "WHERE dataset = ? ORDER BY created", (dataset,)
            ).fetchall()
        return [
            {"release_id": r[0], "created": r[1], "guarantee": json.loads(r[2]),
             "description": r[3]}
            for r in rows
        ]
