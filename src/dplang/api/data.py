"""What the Python API accepts as data, made into the input every command reads.

``data`` is a path (``str`` or :class:`~pathlib.Path`: a CSV, TSV, JSONL, Parquet, Arrow or
text file, or a Hugging Face dataset saved with ``save_to_disk``), or data in memory: a list
of strings (``None`` for a missing one), a list of records (dicts), a pandas ``DataFrame`` or
``Series``, a ``datasets.Dataset`` (the optional extra ``dplang[hf]``) or a ``pyarrow.Table``.

In-memory data goes through exactly the reader a path goes through (:mod:`dplang.io`: the same
skip rule, row positions, refusals): :func:`data_input` writes its rows as an Arrow file into
a private temporary folder (mode 700, the file 600) for the duration of the call, and deletes
it when the call returns. The file is named by its content, so the same data passed again is
the same input (a run into the same ``out=`` resumes; the ledger sees the same content).
Schema metadata (pandas' index description, a Dataset's fingerprint) is dropped and text is
always Arrow's ``string`` (pandas gives ``large_string``): only the columns' names, types and
values make the content, so the same records as a list, a DataFrame or a Dataset are the same
content.

Privacy contract: in-memory data has no path to name its budget by, so ``dataset=`` is
required; the temporary copy is readable by its owner only and outlives no call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DPLangError

__all__ = ["DataInput", "data_input"]

#: The name of the temporary Arrow file of in-memory data (shown in the run's plan line).
IN_MEMORY_NAME = "in-memory.arrow"


@dataclass(frozen=True)
class DataInput:
    """The path a command reads, and the ledger name to charge (None: the path's default)."""

    path: Path
    dataset: str | None
    in_memory: bool


def _describe(data: Any) -> str:
    return f"{type(data).__module__}.{type(data).__qualname__}"


def _as_table(data: Any, text_column: str) -> Any:
    """In-memory ``data`` as a ``pyarrow.Table`` (raises :class:`DPLangError`)."""
    import pyarrow as pa

    module = type(data).__module__
    if isinstance(data, pa.Table):
        return data
    if module.startswith("datasets"):
        name = type(data).__name__
        if name == "DatasetDict" or (hasattr(data, "keys") and not hasattr(data, "features")):
            splits = ", ".join(map(str, data.keys()))
            raise DPLangError(f"data is a DatasetDict (splits: {splits}): pass one split, e.g. "
                              f"data[{next(iter(data.keys()), 'train')!r}]")
        if not hasattr(data, "with_format") or name.startswith("Iterable"):
            raise DPLangError(f"data is a {name}: pass a datasets.Dataset (not streamed)")
        return data.with_format("arrow")[:]
    if module.startswith("pandas"):
        import pandas as pd

        if isinstance(data, pd.Series):
            data = data.to_frame(name=text_column)
        if not isinstance(data, pd.DataFrame):
            raise DPLangError(f"data is a {_describe(data)}: pass a DataFrame or a Series")
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DPLangError(f"the DataFrame cannot be read as a table ({first}): give each "
                              "column one type (text as str, missing values as None)") from None
    if isinstance(data, (bytes, bytearray)) or not isinstance(data, Sequence):
        raise DPLangError(f"data must be a list of strings, a pandas DataFrame, a "
                          f"datasets.Dataset or a path (str or Path), not a {_describe(data)}")
    if data and all(isinstance(item, Mapping) for item in data):  # records
        try:
            return pa.Table.from_pylist([dict(item) for item in data])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DPLangError(f"the records cannot be read as a table ({first}): give each "
                              "key values of one type (missing values as None)") from None
    if data and isinstance(data[0], Mapping):  # records, but not all of them
        i, item = next((i, item) for i, item in enumerate(data)
                       if not isinstance(item, Mapping))
        raise DPLangError(f"data[{i}] is a {type(item).__name__} but data[0] is a record: a "
                          "list of records holds dicts only")
    for i, item in enumerate(data):
        if item is not None and not isinstance(item, str):
            raise DPLangError(f"data[{i}] is a {type(item).__name__}: a list of texts holds "
                              "strings (None for a missing text)")
    return pa.table({text_column: pa.array(list(data), type=pa.string())})


def _table(data: Any, text_column: str) -> Any:
    """:func:`_as_table`, with every refusal a :class:`DPLangError` naming the problem (a
    repeated column name, a text Arrow cannot hold, a number too large for its column)."""
    try:
        table = _as_table(data, text_column)
    except DPLangError:
        raise
    except UnicodeEncodeError as exc:
        raise DPLangError(f"the data holds a string that is not valid Unicode ({exc.reason}: "
                          f"{exc.object[exc.start:exc.end]!r}): text must encode as UTF-8"
                          ) from None
    except (OverflowError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DPLangError(f"the data cannot be read as a table ({type(exc).__name__}: "
                          f"{first[:200]})") from None
    names = list(table.column_names)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DPLangError(f"the data has more than one column named "
                          f"{', '.join(map(repr, repeated))}: give each column its own name")
    return table


def _ipc_bytes(table: Any) -> bytes:
    """The table as Arrow IPC stream bytes (every column, as a file holds them; the run reads
    the ones it needs), schema metadata dropped."""
    import pyarrow as pa

    # one Arrow type per kind of value: pandas writes text as large_string, a list as string
    table = table.cast(pa.schema([
        pa.field(f.name, pa.string() if pa.types.is_large_string(f.type) else f.type)
        for f in table.schema]))
    # one batch: the same records in one chunk or several (a concatenated table, a Dataset's
    # select) are the same content
    table = table.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _private_base() -> Path | None:
    """``$TMPDIR/dplang-UID``, mode 700 and ours; None when it cannot be trusted."""
    base = Path(tempfile.gettempdir()) / f"dplang-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return base


@contextlib.contextmanager
def _materialized(raw: bytes) -> Iterator[Path]:
    """``raw`` as a private file named by its content, for the block; deleted by the last of
    the processes using it (a shared lock each; an exclusive one to delete)."""
    from ..release import write_atomic

    base = _private_base()
    if base is None:  # an untrusted shared folder: a fresh private one (no resume by content)
        folder = Path(tempfile.mkdtemp(prefix="dplang-data-"))
        try:
            path = folder / IN_MEMORY_NAME
            write_atomic(path, raw, private=True)
            yield path
        finally:
            for p in folder.iterdir():
                p.unlink(missing_ok=True)
            folder.rmdir()
        return
    folder = base / hashlib.sha256(raw).hexdigest()[:32]
    _sweep_unused(base, keep=folder)
    path, users = folder / IN_MEMORY_NAME, folder / ".users"
    while True:
        folder.mkdir(mode=0o700, exist_ok=True)
        try:
            fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # its last user removed the folder meanwhile
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(users))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its last user removed it meanwhile: take a new one
    try:
        if not path.exists():
            write_atomic(path, raw, private=True)
        yield path
    finally:
        _delete_if_unused(folder, fd)  # the last user deletes


def _delete_if_unused(folder: Path, fd: int) -> None:
    """Delete ``folder``'s data file, its ``.users`` file (open as ``fd``) and the folder
    when no process holds ``.users`` (an exclusive lock is free); close ``fd`` either way."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    else:
        (folder / IN_MEMORY_NAME).unlink(missing_ok=True)
        (folder / ".users").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
    finally:
        os.close(fd)


def _sweep_unused(base: Path, keep: Path) -> None:
    """Delete the copies of data a process left in ``base`` when it died inside a call (a
    ``kill -9`` runs no ``finally``): every folder but ``keep`` whose ``.users`` no process
    holds. A folder being made has no ``.users`` yet, or one its maker holds: kept."""
    with contextlib.suppress(OSError):
        for folder in base.iterdir():
            if folder == keep or not folder.is_dir() or folder.is_symlink():
                continue
            try:
                fd = os.open(folder / ".users", os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                continue
            _delete_if_unused(folder, fd)


@contextlib.contextmanager
def data_input(data: Any, *, dataset: str | None, text_column: str = "text"
               ) -> Iterator[DataInput]:
    """The input a command reads for ``data`` (see the module docstring), for the block.

    ``text_column`` names the column of a list of texts. Raises :class:`DPLangError` for data
    of another kind, and for in-memory data without ``dataset``."""
    if isinstance(data, (str, os.PathLike)):
        yield DataInput(Path(data).expanduser(), dataset, False)
        return
    table = _table(data, text_column)
    if dataset is None or not str(dataset).strip():
        raise DPLangError("dataset= is required for data in memory (a list, a DataFrame, a "
                          "Dataset): the privacy ledger keeps the data's budget under that "
                          "name; give the same name each time you pass these records")
    with _materialized(_ipc_bytes(table)) as path:
        yield DataInput(path, dataset, True)
