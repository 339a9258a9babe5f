"""The options several commands share, each declared once here: ``--ledger``, ``--dataset``,
``--seed`` (a release's secret seed) and ``--overwrite``. A command passes only what is its own
(where its seed is kept, what ``--overwrite`` replaces), so the flag's name, type, default and
meaning cannot drift between commands.

Privacy contract: none by themselves; the seed's help states the rule every release follows
(secret, fresh OS entropy by default, one seed per release: docs/privacy.md, "Seeds")."""

from __future__ import annotations

from typing import Any

import typer

__all__ = ["LEDGER_HELP", "dataset_option", "ledger_option", "overwrite_option", "seed_option"]

#: ``--ledger`` of every command: a file path or a PostgreSQL URL, taken as a str (a Path
#: would fold the URL's ``//``).
LEDGER_HELP = ("Privacy ledger: an SQLite file, or a postgresql://USER@HOST/DB URL for a ledger "
               "shared by several machines (default: $DPLANG_LEDGER or the user data dir).")


def ledger_option() -> Any:
    """``--ledger PATH|URL`` (default None: ``$DPLANG_LEDGER`` or the user data dir's)."""
    return typer.Option(None, "--ledger", help=LEDGER_HELP)


def dataset_option(default: str = "the data file's resolved path") -> Any:
    """``--dataset NAME``: the ledger key of the data (:func:`dplang.release.dataset_key`);
    ``default`` says what it is without the flag."""
    return typer.Option(None, "--dataset",
                        help=f"Ledger name of the data's budget (default: {default}).")


def seed_option(kept: str, note: str = "") -> Any:
    """``--seed`` of a release: secret, fresh OS entropy when not given, one seed per release
    (the ledger refuses its reuse for the dataset); ``kept`` says where it is stored (or that
    it is not), ``note`` anything else the command does with it."""
    return typer.Option(None, "--seed", help=f"Secret seed (default: fresh OS entropy); {kept}; "
                        f"one seed per release.{note}")


def overwrite_option(replaces: str) -> Any:
    """``--overwrite``: replace what the output already holds; ``replaces`` (the help) says
    what that is and when the old files go (for a release: only once the new one is charged)."""
    return typer.Option(False, "--overwrite", help=replaces)
