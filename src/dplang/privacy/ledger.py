"""A persistent privacy-budget ledger, private to the data holder: an SQLite file (the embedded
default) or, for a budget that several analysts or machines spend, a PostgreSQL database
(``--ledger``/``$DPLANG_LEDGER`` a ``postgresql://`` URL; :mod:`dplang.privacy.ledger_backends`
holds the connections, the dialects and the schema, the same tables in both).

Datasets are keyed by a *name* the user chooses (CLI ``--dataset NAME``; default the input
file's resolved path), not by the content of the file: a re-encoded, re-ordered or re-sorted
copy of the same records has other bytes, so a content key would silently give it a fresh
budget. The SHA-256 of the content used by each release is kept in the ledger only, so that
:meth:`PrivacyLedger.content_warnings` can tell the data holder when a name's content changed
or when the same bytes were already charged under another name. A copy with other bytes charged
under another name (its own path, by default) gets a fresh budget without any warning: only
one name per dataset protects it (a name is a name: :func:`dplang.release.dataset_key`).

Each dataset may carry a total (ε, δ) budget. Every release is written to the ledger *before* its
output is written (``docs/privacy.md`` invariant 6); a release that would take the
dataset past its budget is refused with :class:`BudgetExceeded` and nothing is recorded. Charging
runs in one transaction (read the spend, check, insert) that the backend serialises with every
other charge or budget change of the same dataset (SQLite: ``BEGIN IMMEDIATE``, the file's write
lock; PostgreSQL: a read-committed transaction holding the dataset's
``pg_advisory_xact_lock``), so processes charging the same ledger at once, on one machine or
several, can never exceed a budget together.

Composition across releases: releases that carry a zCDP parameter are summed in zCDP and
converted at the budget's δ minus the δ spent by approximate-DP releases that carry no zCDP
parameter; those add their ε by basic composition.

Adjacency: every release's guarantee holds for one notion of neighbouring datasets
(``Guarantee.adjacency``), and costs under different notions do not add up. When all DP
releases of a dataset share one adjacency, the total is stated under it. When they differ, the
total is stated under **replace-one** (one record of the dataset replaced by any other; group
labels that a generation treats as public stay public), the notion every other one converts
into soundly: one replace-one change is two steps of replace-by-null (x → null → y), of
zero-out (x → 0 → y) or of add-remove (remove x, add y), so by group privacy at distance k = 2
a ρ-zCDP release costs k²ρ = 4ρ, a pure ε-DP one kε = 2ε, and approximate (ε, δ)-DP ones (their
basic composition) (kε, δ·Σ_{i<k} e^{iε}) = (2ε, δ(1 + e^ε)) (:data:`REPLACE_ONE_DISTANCE`,
:func:`to_replace_one`). A release under replace-one also holds, unchanged, under
replace-by-null (a null record is one of the "any other" records), which is why the total of a
dataset whose releases are all replace-by-null or replace-one could be stated more cheaply under
replace-by-null; the ledger states the stronger, replace-one total. Budgets are checked against
the total so stated, so the first release whose adjacency differs from the others' can be
refused although its own cost fits: it makes the earlier ones count 4ρ.

Data-dependent releases (``Guarantee.ex_ante`` False, e.g. the AdaPMixED baseline) and toy runs
(``Guarantee.public_seed`` True: a seed written in a configuration file) have no
differential-privacy guarantee: they are recorded and shown separately (the ``ex_ante`` column
is 0 for both; the recorded guarantee says which), never summed into the DP total, and a
dataset with a budget refuses them (no DP budget can account for them).

Charging is idempotent per ``release_id``. The release pipeline (:mod:`dplang.release`)
identifies a release by everything that determines its output (parameters, data, seed), so
resuming an interrupted run charges nothing new while a new seed is a new charge. A seed is
the secret of one release: the ledger keeps a tag of it (H(dataset, seed), ``seed_tag``) and
refuses it for a second release of the same dataset (:class:`SeedReused`), although each
release already derives its noise from the seed *and* its release id.

Privacy of the ledger itself: it holds content digests, dataset names, output paths and
release ids (hashes that include the seed), so it is as private as the data. A file is created
with mode 600; a database's access rights are the data holder's to restrict. The ledger is never
written into any public output, and a URL is only ever printed with its password masked.

Size: the refuse-before-exceeding transaction and the adjacency-aware totals are one
consistency argument and are read together here; what it relies on from the backends — the
schema (``release_id`` the primary key) and :meth:`LedgerBackend.write`, serialised per dataset
— is stated at the top of :mod:`dplang.privacy.ledger_backends`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accounting import rho_to_epsilon
from .guarantees import Guarantee
from .ledger_backends import (
    ADDED_COLUMNS,
    TABLES,
    Db,
    LedgerBackend,
    LedgerError,
    backend_for,
    ledger_location,
    schema_statements,
)

__all__ = ["BudgetExceeded", "LedgerError", "PrivacyLedger", "SeedReused", "Spend",
           "check_ledger_path", "to_replace_one"]


class BudgetExceeded(RuntimeError):
    """The release would exceed the dataset's privacy budget; nothing was recorded."""


class SeedReused(BudgetExceeded):
    """The release's seed was already used for another release of the same dataset; nothing
    was recorded. (Each release derives its noise from the seed *and* its release id, so a
    reused seed no longer repeats the noise; the ledger refuses it anyway, as a second line of
    defence: a seed is the secret of one release.) A subclass of :class:`BudgetExceeded`: the
    commands refuse it the same way (exit code 3, nothing written)."""


def check_ledger_path(path: str | Path | None = None) -> Path | str:
    """The ledger location (``path`` or ``$DPLANG_LEDGER`` or the user data directory's
    ``dplang/ledger.sqlite``: :func:`~dplang.privacy.ledger_backends.ledger_location`), checked
    without creating anything. A file: an existing ledger must be a regular, readable and
    writable SQLite database that is empty or holds dplang's tables; a new one must be
    creatable (no ancestor is a file or read-only). A PostgreSQL URL: no file-system check;
    psycopg must be installed, the server reachable, the login accepted, and the database must
    hold both ledger tables or neither. Raises :class:`LedgerError` with a one-line message
    (a URL's password masked). Returns the location (a URL as given)."""
    where = ledger_location(path)
    backend_for(where).check()
    return where


#: How many steps of each adjacency one replace-one change of a record is (group privacy).
REPLACE_ONE_DISTANCE: dict[str, int] = {
    "replace-one": 1,
    "replace-by-null": 2,  # x → null → y
    "zero-out": 2,  # x → 0 → y
    "add-remove": 2,  # remove x, add y
}


def to_replace_one(adjacency: str, rho: float, epsilon: float, delta: float
                   ) -> tuple[float, float, float]:
    """(ρ, ε, δ) of releases composed under ``adjacency`` — ρ the Σρ of its zCDP releases,
    (ε, δ) the basic composition of the others — restated under replace-one adjacency by group
    privacy at distance k = :data:`REPLACE_ONE_DISTANCE` [adjacency]: (k²ρ, kε,
    δ·Σ_{i<k} e^{iε}), δ capped at 1 (no guarantee).

    Privacy contract: sound for any mechanism that satisfies the stated guarantee under
    ``adjacency``, because a replace-one neighbour is reached in k steps of that adjacency."""
    if adjacency not in REPLACE_ONE_DISTANCE:
        raise ValueError(f"unknown adjacency {adjacency!r}")
    k = REPLACE_ONE_DISTANCE[adjacency]
    if k == 1:
        return rho, epsilon, delta
    if delta == 0:
        new_delta = 0.0
    else:
        growth = sum(math.exp(min(i * epsilon, 700.0)) for i in range(k))
        new_delta = min(1.0, delta * growth)
    return k * k * rho, k * epsilon, new_delta


def _add(acc: tuple[float, float, float, int] | None, rho: float | None, epsilon: float,
         delta: float) -> tuple[float, float, float, int]:
    """(Σρ, Σε, Σδ, count) with one more release: its ρ when it has one, else its (ε, δ)."""
    r, e, d, n = acc if acc is not None else (0.0, 0.0, 0.0, 0)
    if rho is not None:
        return r + rho, e, d, n + 1
    return r, e + epsilon, d + delta, n + 1


@dataclass(frozen=True)
class Spend:
    """What a dataset has spent.

    ``rho``: Σρ of the zCDP releases; ``approx_epsilon``/``approx_delta``: basic composition
    of the DP releases without a zCDP parameter — both stated under ``adjacency``: the one
    adjacency all DP releases share, or ``"replace-one"`` when they differ (the others then
    converted by group privacy, :func:`to_replace_one`; ``converted`` of them), or None when
    there is no DP release. ``by_adjacency`` holds the unconverted sums per adjacency
    (adjacency, Σρ, Σε, Σδ, releases). ``releases``: all releases, data-dependent ones
    included; ``data_dependent``: releases with no ex-ante DP guarantee, with their nominal
    (target) ε and δ summed in ``data_dependent_epsilon``/``_delta``; ``toy``: toy runs (a
    public seed: no guarantee at all) — neither is part of any DP total."""

    rho: float
    approx_epsilon: float
    approx_delta: float
    releases: int
    data_dependent: int = 0
    data_dependent_epsilon: float = 0.0
    data_dependent_delta: float = 0.0
    adjacency: str | None = None
    converted: int = 0
    by_adjacency: tuple[tuple[str, float, float, float, int], ...] = ()
    toy: int = 0

    @classmethod
    def compose(cls, dp: list[tuple[str, float | None, float, float]],
                data_dependent: list[tuple[float, float]] | None = None,
                toy: int = 0) -> Spend:
        """The spend of DP releases given as (adjacency, ρ or None, ε, δ), data-dependent
        ones as (nominal ε, nominal δ) and ``toy`` toy runs: sums per adjacency, then one
        total (see the class)."""
        sums: dict[str, tuple[float, float, float, int]] = {}
        for adjacency, rho, eps, dlt in dp:
            sums[adjacency] = _add(sums.get(adjacency), rho, eps, dlt)
        dd = data_dependent or []
        return cls._from_sums(sums, len(dd), sum(e for e, _ in dd), sum(d for _, d in dd),
                              toy)

    @classmethod
    def _from_sums(cls, sums: dict[str, tuple[float, float, float, int]], dd: int,
                   dd_eps: float, dd_delta: float, toy: int = 0) -> Spend:
        parts = tuple((a, *sums[a]) for a in sorted(sums))
        converted = 0
        if len(parts) == 1:
            adjacency: str | None = parts[0][0]
            rho, eps, dlt = parts[0][1], parts[0][2], parts[0][3]
        else:
            adjacency = "replace-one" if parts else None
            rho = eps = dlt = 0.0
            for a, r, e, d, count in parts:
                r2, e2, d2 = to_replace_one(a, r, e, d)
                rho, eps, dlt = rho + r2, eps + e2, dlt + d2
                if REPLACE_ONE_DISTANCE[a] > 1:
                    converted += count
        releases = sum(p[4] for p in parts) + dd + toy
        return cls(rho, eps, min(dlt, 1.0), releases, dd, dd_eps, dd_delta, adjacency,
                   converted, parts, toy)

    def plus(self, guarantee: Guarantee) -> Spend:
        """This spend with one more DP release (``guarantee.ex_ante`` must be True)."""
        sums = {a: (r, e, d, n) for a, r, e, d, n in self.by_adjacency}
        sums[guarantee.adjacency] = _add(sums.get(guarantee.adjacency), guarantee.rho,
                                         guarantee.epsilon, guarantee.delta)
        return Spend._from_sums(sums, self.data_dependent, self.data_dependent_epsilon,
                                self.data_dependent_delta, self.toy)

    @property
    def dp_releases(self) -> int:
        """Releases with an ex-ante DP guarantee and a secret seed (those the totals cover)."""
        return self.releases - self.data_dependent - self.toy

    def epsilon_at(self, delta: float) -> float:
        """Total ε of the DP releases at total δ = ``delta``, under :attr:`adjacency` (inf when
        ``delta`` ≤ the approximate releases' δ). Data-dependent releases are not included."""
        remaining = delta - self.approx_delta
        if self.rho == 0:
            return self.approx_epsilon if remaining >= 0 else float("inf")
        if remaining <= 0:
            return float("inf")
        return rho_to_epsilon(self.rho, remaining) + self.approx_epsilon


def _adjacency(guarantee_json: str) -> str:
    """The adjacency recorded in a release's guarantee (every Guarantee has one)."""
    return str(json.loads(guarantee_json)["adjacency"])


#: The :meth:`LedgerBackend.write` key that serialises schema creation and migration (a name
#: no dataset is given: it starts with a NUL).
_SCHEMA_KEY = "\x00dplang-schema"


class PrivacyLedger:
    """Persistent record of budgets and releases: one SQLite file (mode 600), or a PostgreSQL
    database for a budget spent from several machines (``location`` a ``postgresql://`` URL).

    ``path`` is the ledger file (None for a database); ``location`` names the ledger in
    messages and private files (a URL with its password masked)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._backend: LedgerBackend = backend_for(path)
        self.path: Path | None = self._backend.path
        self.location: str = self._backend.location
        self._backend.prepare()
        self._ensure_schema()

    def _connect(self) -> Any:
        """A connection (autocommit); a driver failure becomes a one-line LedgerError."""
        return self._backend.connect()

    def _write(self, dataset: str) -> Any:
        """A transaction serialised with every other charge or budget change of ``dataset``
        (:meth:`LedgerBackend.write`): committed at the end of the block, rolled back when it
        raises."""
        return self._backend.write(dataset)

    def _ensure_schema(self) -> None:
        """Create the tables, or add the columns a ledger written by an older dplang lacks
        (its data-dependent releases then marked from their recorded guarantee)."""
        def complete(columns: dict[str, set[str]]) -> bool:
            return set(columns) >= TABLES and set(ADDED_COLUMNS) <= columns["releases"]

        with self._connect() as db:
            if complete(self._backend.columns(db)):
                return
        with self._write(_SCHEMA_KEY) as db:
            had_releases = "releases" in self._backend.columns(db)
            for statement in schema_statements(self._backend.real):
                db.execute(statement)
            columns = self._backend.columns(db)["releases"]
            added = [name for name in ADDED_COLUMNS if name not in columns]
            for name in added:
                db.execute(f"ALTER TABLE releases ADD COLUMN {name} {ADDED_COLUMNS[name]}")
            if had_releases and "ex_ante" in added:
                for release_id, text in db.execute(
                        "SELECT release_id, guarantee FROM releases").fetchall():
                    if not json.loads(text).get("ex_ante", True):
                        db.execute("UPDATE releases SET ex_ante = 0 WHERE release_id = ?",
                                   (release_id,))

    def set_budget(self, dataset: str, epsilon: float, delta: float) -> None:
        """Set (or replace) a dataset's total (ε, δ) budget. Refused below what is spent.

        The budget bounds the DP releases only; data-dependent releases already recorded stay
        outside it (``dplang ledger show`` flags them)."""
        if not epsilon > 0 or not 0 < delta < 1:
            raise ValueError("a budget needs epsilon > 0 and delta in (0, 1)")
        with self._write(dataset) as db:
            spent = self._spent(db, dataset)
            if spent.dp_releases and spent.epsilon_at(delta) > epsilon:
                raise BudgetExceeded(
                    f"dataset {dataset} has already spent ε={spent.epsilon_at(delta):.4g} "
                    f"at δ={delta:g}; a budget of ε={epsilon:g} is below that"
                )
            db.execute(
                "INSERT INTO budgets (dataset, epsilon, delta, created) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (dataset) DO UPDATE SET epsilon = excluded.epsilon, "
                "delta = excluded.delta, created = excluded.created",
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
    def _spent(db: Db, dataset: str) -> Spend:
        rows = db.execute(
            "SELECT rho, epsilon, delta, ex_ante, guarantee FROM releases WHERE dataset = ?",
            (dataset,)
        ).fetchall()
        dp = [(_adjacency(r[4]), r[0], r[1], r[2]) for r in rows if r[3]]
        toy = [r for r in rows if not r[3] and json.loads(r[4]).get("public_seed")]
        dd = [(r[1], r[2]) for r in rows if not r[3] and r not in toy]
        return Spend.compose(dp, dd, len(toy))

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

    def adjacency_warnings(self, dataset: str, guarantee: Guarantee) -> list[str]:
        """A warning when charging ``guarantee`` makes the dataset's DP releases mix
        adjacencies: from then on its total is stated under replace-one, the other releases
        counted by group privacy (module docstring). For the data holder's terminal."""
        if not guarantee.is_dp:
            return []
        before = self.spent(dataset)
        after = before.plus(guarantee)
        if before.adjacency is None or after.adjacency == before.adjacency:
            return []
        return [f"dataset {dataset!r} had only {before.adjacency} releases; this "
                f"{guarantee.adjacency} release ({guarantee.mechanism}) mixes adjacencies, so "
                "its total is now stated under replace-one (one record replaced by any other): "
                "each release under another adjacency counts by group privacy at distance 2 "
                "(4ρ, 2ε); `dplang ledger show` shows the converted total"]

    def charge(
        self, dataset: str, release_id: str, guarantee: Guarantee, description: str = "",
        data_digest: str | None = None, seed_tag: str | None = None,
    ) -> bool:
        """Record a release before its output is written.

        Returns False (and charges nothing) when ``release_id`` is already recorded, True when
        it was recorded now. Raises :class:`SeedReused` when ``seed_tag`` (a hash of the
        dataset and the release's seed; :attr:`dplang.release.Release.seed_tag`) was already
        recorded for another release of the dataset, and :class:`BudgetExceeded` when the
        dataset has a budget and this release would exceed it, or when it has a budget and
        the release is not DP (data-dependent, or a toy run with a public seed); then nothing
        is recorded.
        """
        with self._write(dataset) as db:
            exists = db.execute(
                "SELECT 1 FROM releases WHERE release_id = ?", (release_id,)
            ).fetchone()
            if exists:
                return False
            if seed_tag is not None and db.execute(
                    "SELECT 1 FROM releases WHERE dataset = ? AND seed_tag = ? "
                    "AND release_id != ? LIMIT 1", (dataset, seed_tag, release_id)).fetchone():
                raise SeedReused(
                    f"release refused: this seed was already used for another release of "
                    f"dataset {dataset}; a seed is the secret of one release (rerunning the "
                    "same command on the same data with it is the same release, anything else "
                    "needs another one): pass another --seed, or none for a fresh secret seed"
                )
            self._refuse_over_budget(db, dataset, [guarantee])
            # DO NOTHING: the same release id committed meanwhile under another dataset's
            # lock (PostgreSQL locks per dataset) is a resumed release, not a new charge.
            # ex_ante = 0 for every release that is not DP (data-dependent, or a toy run):
            # never summed into the DP total; the guarantee says which kind it is
            inserted = db.execute(
                "INSERT INTO releases (release_id, dataset, created, mechanism, rho, "
                "epsilon, delta, guarantee, description, ex_ante, data_digest, seed_tag) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (release_id) DO NOTHING",
                (release_id, dataset, time.time(), guarantee.mechanism, guarantee.rho,
                 guarantee.epsilon, guarantee.delta, guarantee.to_json(), description,
                 int(guarantee.is_dp), data_digest, seed_tag),
            ).rowcount
            return inserted == 1

    def check_charge(self, dataset: str, guarantee: Guarantee) -> None:
        """Raise :class:`BudgetExceeded` when a new release of ``guarantee`` would be refused
        now, by :meth:`charge`'s own rule and message; records nothing. A command checks this
        before it reads data or loads a model (a refusal then costs milliseconds); the charge
        itself checks again, atomically, at the last moment."""
        self.check_charges(dataset, [guarantee])

    def check_charges(self, dataset: str, guarantees: Sequence[Guarantee]) -> None:
        """Raise :class:`BudgetExceeded` when new releases of all ``guarantees``, charged one
        after another, would be refused at any of them by :meth:`charge`'s rule; records
        nothing. A command of several releases (an experiment's cells) checks this before the
        first is charged: otherwise the releases ahead of the refused one would be charged and
        published, and the command stop halfway. Everything it reads is public (the budget,
        the ledger's releases, each release's ex-ante guarantee)."""
        with self._connect() as db:
            self._refuse_over_budget(db, dataset, list(guarantees))

    def _refuse_over_budget(self, db: Db, dataset: str, guarantees: list[Guarantee]) -> None:
        budget = db.execute(
            "SELECT epsilon, delta FROM budgets WHERE dataset = ?", (dataset,)
        ).fetchone()
        if budget is None or not guarantees:
            return
        for guarantee in guarantees:
            if guarantee.public_seed:
                raise BudgetExceeded(
                    f"release refused: dataset {dataset} has a differential-privacy "
                    f"budget and this {guarantee.mechanism} release is a toy run (its seed is "
                    "public, written in a configuration file), which has no privacy guarantee "
                    "at all: remove the seeds from the configuration (each release then gets "
                    "a fresh secret seed)"
                )
            if not guarantee.ex_ante:
                raise BudgetExceeded(
                    f"release refused: dataset {dataset} has a differential-privacy "
                    f"budget and this {guarantee.mechanism} release has "
                    + _not_dp_kind(guarantee)
                    + ", which no DP budget can account for"
                )
        after = self._spent(db, dataset)
        for guarantee in guarantees:
            after = after.plus(guarantee)
        total = after.epsilon_at(budget[1])
        if total > budget[0] * (1 + 1e-12):
            mixed = ("" if len(after.by_adjacency) < 2 else
                     f" under {after.adjacency} adjacency (its releases mix "
                     "adjacencies: the others count by group privacy)")
            what = ("release refused" if len(guarantees) == 1 else
                    f"{len(guarantees)} releases refused")
            raise BudgetExceeded(
                f"{what}: dataset {dataset} would spend ε={total:.4g} at "
                f"δ={budget[1]:g}{mixed}, over its budget ε={budget[0]:g}"
            )

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


def _not_dp_kind(guarantee: Guarantee) -> str:
    """What a guarantee that is not ex-ante DP is, for a refusal's message."""
    if math.isinf(guarantee.epsilon):
        return "no differential-privacy guarantee at all (the non-private ceiling)"
    if guarantee.details.get("unproven"):
        return "only a bound resting on an unproven assumption (not differential privacy)"
    return "only a data-dependent bound (not differential privacy)"
