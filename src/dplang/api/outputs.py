"""Where a call's files go: ``out=`` when given, else a private temporary folder that lives as
long as the call (the Python API's "nothing is written but the ledger entry").

Privacy contract: the temporary folder is created with mode 700 (``tempfile.mkdtemp``), so the
private side file written there (the seed, the data digest) is never readable by others, and
it is removed with everything in it when the block ends, whatever ends it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["output_location"]


@contextlib.contextmanager
def output_location(out: str | Path | None, name: str) -> Iterator[tuple[Path, bool]]:
    """(the output path, whether it is kept): ``out``, or a file in a private temporary folder
    (mode 700) removed with everything in it when the block ends."""
    if out is not None:
        yield Path(out).expanduser(), True
        return
    from ..release import TEMPORARY_RUN_PREFIX

    folder = Path(tempfile.mkdtemp(prefix=TEMPORARY_RUN_PREFIX))
    try:
        yield folder / name, False
    finally:
        shutil.rmtree(folder, ignore_errors=True)
