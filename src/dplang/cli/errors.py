"""One-line errors for the command line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer


class CliError(Exception):
    """A user error: printed as one line ``error: ...`` and exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = 2) -> NoReturn:
    """Abort the command with a one-line error message."""
    raise CliError(message, code)


def echo_error(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


@contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """Hold ``out``'s :class:`~dplang.release.RunLock` for the block: a second process on the
    same output is refused with a one-line error before anything is read or loaded."""
    from ..release import ReleaseError, RunLock

    try:
        lock = RunLock(out).acquire()
    except ReleaseError as exc:
        fail(str(exc))
    try:
        yield
    finally:
        lock.release()


def use_threads(threads: int | None) -> None:
    """``--threads N``: every model this process (and its local workers) loads uses N
    threads (through ``$DPLANG_THREADS``, which the models read; speed only, never a bit)."""
    if threads is not None:
        os.environ["DPLANG_THREADS"] = str(int(threads))
