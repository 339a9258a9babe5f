"""Where a call's files go: ``out=`` when given, else a private temporary folder that lives as
long as the call (the Python API's "nothing is written but the ledger entry").

Privacy contract: the temporary folder is created with mode 700 (``tempfile.mkdtemp``), so the
private side file written there (the data digest and counts; the seed is not stored for a
temporary output) is never readable by others, and it is removed with everything in it when
the block ends, whatever ends it. A process killed inside the block (``kill -9`` runs no
``finally``) leaves its folder behind: the next call removes every such folder, found by a
lock (``.call``) that its live call holds for the folder's whole life.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["output_location"]

#: The lock a live call holds in its temporary folder.
CALL_LOCK = ".call"


@contextlib.contextmanager
def output_location(out: str | Path | None, name: str) -> Iterator[tuple[Path, bool]]:
    """(the output path, whether it is kept): ``out``, or a file in a private temporary folder
    (mode 700) removed with everything in it when the block ends."""
    if out is not None:
        yield Path(out).expanduser(), True
        return
    from ..release import TEMPORARY_RUN_PREFIX

    _sweep_abandoned(Path(tempfile.gettempdir()), TEMPORARY_RUN_PREFIX)
    folder = Path(tempfile.mkdtemp(prefix=TEMPORARY_RUN_PREFIX))
    fd = -1
    try:
        # locked before it has its name: a sweep never finds the lock free in a live folder
        fd, held = tempfile.mkstemp(dir=folder, prefix=".call-")
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(held, folder / CALL_LOCK)
        yield folder / name, False
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def _sweep_abandoned(tmp: Path, prefix: str) -> None:
    """Remove the temporary folders of calls whose process died: ours (owner, mode 700), with
    a ``.call`` lock that no process holds. A folder without one is being made: kept."""
    uid = os.getuid()
    with contextlib.suppress(OSError):
        for folder in tmp.glob(prefix + "*"):
            try:
                info = os.lstat(folder)
                if (not stat.S_ISDIR(info.st_mode) or info.st_uid != uid
                        or info.st_mode & 0o077):
                    continue
                fd = os.open(folder / CALL_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass  # a live call
            else:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                os.close(fd)
