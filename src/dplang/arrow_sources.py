"""Arrow-backed inputs: Parquet files, Arrow IPC files and Hugging Face datasets on disk.

One small interface, :class:`ArrowSource` (a schema and record batches), over three layouts:

==================================  =========================================================
``data.parquet``                    :class:`pyarrow.parquet.ParquetFile`, read in batches
``data.arrow`` / ``data.feather``   an Arrow IPC file (``ARROW1`` magic: the random-access
                                    "file" format, what Feather v2 writes) or stream (what
                                    ``datasets`` writes its shards in), memory-mapped
a folder                            a ``datasets.Dataset`` saved with ``save_to_disk``: its
                                    ``state.json`` lists the Arrow shards (IPC streams) in
                                    order; a ``DatasetDict`` folder (``dataset_dict.json``)
                                    is refused with the names of its splits
==================================  =========================================================

``datasets`` itself is not needed to read any of them: a saved dataset's shards are plain
Arrow streams. The rows are the shards' rows in order, as ``datasets.load_from_disk`` gives
them (``save_to_disk`` writes the rows of an index mapping, e.g. after ``select``, not the
underlying table).

Privacy contract: none by itself; which rows and columns exist is decided by the files'
layout and schema (public), never by a value (``dplang.io``'s skip rule applies on top).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ArrowSource", "dataset_folder_files", "is_dataset_folder", "open_arrow_source"]

#: The file a ``datasets.Dataset.save_to_disk`` folder lists its shards in.
STATE_FILE = "state.json"
#: The file of a ``datasets.DatasetDict.save_to_disk`` folder (one sub-folder per split).
DICT_FILE = "dataset_dict.json"
_IPC_FILE_MAGIC = b"ARROW1"

Fail = Callable[[str], Exception]


def is_dataset_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` (or
    ``DatasetDict.save_to_disk``, which :func:`dataset_folder_files` refuses by name)."""
    path = Path(path)
    return path.is_dir() and ((path / STATE_FILE).is_file() or (path / DICT_FILE).is_file())


def dataset_folder_files(path: str | Path, fail: Fail) -> list[Path]:
    """The Arrow shards of a saved ``datasets.Dataset``, in row order. A ``DatasetDict`` (several
    splits), a folder without ``state.json`` or a listed shard that is missing raise
    ``fail(message)`` (one line)."""
    path = Path(path)
    if (path / DICT_FILE).is_file() and not (path / STATE_FILE).is_file():
        try:
            splits = json.loads((path / DICT_FILE).read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            splits = sorted(p.name for p in path.iterdir() if (p / STATE_FILE).is_file())
        first = splits[0] if splits else "train"
        raise fail(f"{path}: a Hugging Face DatasetDict (splits: {', '.join(map(str, splits))})"
                   f"; give one split's folder, e.g. {path / str(first)}")
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except FileNotFoundError:
        raise fail(f"{path}: a folder, not a data file or a Hugging Face dataset saved with "
                   f"save_to_disk (no {STATE_FILE})") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise fail(f"{path}: its {STATE_FILE} does not list the dataset's Arrow files "
                   "(_data_files)") from None
    files = [path / name for name in names]
    for file in files:
        if not file.is_file():
            raise fail(f"{path}: {file.name}, listed in {STATE_FILE}, is missing")
    if not files:
        raise fail(f"{path}: the dataset has no Arrow files")
    return files


@dataclass
class ArrowSource:
    """A schema and the record batches of one input (see the module docstring)."""

    path: Path
    schema: Any  # pyarrow.Schema
    _batches: Callable[[list[str], int], Iterator[Any]]

    def iter_batches(self, columns: Sequence[str], chunk_rows: int = 4096) -> Iterator[Any]:
        """Record batches of ``columns`` (names of the schema), in row order."""
        return self._batches(list(columns), chunk_rows)

    def read(self, columns: Sequence[str]) -> Any:
        """All rows of ``columns`` as one ``pyarrow.Table``."""
        import pyarrow as pa

        batches = list(self.iter_batches(columns))
        schema = pa.schema([self.schema.field(c) for c in columns])
        return pa.Table.from_batches(batches, schema=schema)


def _ipc_batches(files: Sequence[Path]) -> Callable[[list[str], int], Iterator[Any]]:
    import pyarrow as pa

    def batches(columns: list[str], _chunk_rows: int) -> Iterator[Any]:
        for file in files:
            with pa.memory_map(str(file)) as source:
                if source.read(len(_IPC_FILE_MAGIC)) == _IPC_FILE_MAGIC:
                    source.seek(0)
                    reader = pa.ipc.open_file(source)
                    parts = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    source.seek(0)
                    parts = iter(pa.ipc.open_stream(source))
                for batch in parts:
                    yield batch.select(columns)

    return batches


def _ipc_schema(file: Path) -> Any:
    import pyarrow as pa

    with pa.memory_map(str(file)) as source:
        if source.read(len(_IPC_FILE_MAGIC)) == _IPC_FILE_MAGIC:
            source.seek(0)
            return pa.ipc.open_file(source).schema
        source.seek(0)
        return pa.ipc.open_stream(source).schema


def open_arrow_source(path: str | Path, fmt: str, fail: Fail) -> ArrowSource:
    """The :class:`ArrowSource` of a ``parquet`` file, an ``arrow`` IPC file or an
    ``hf_dataset`` folder; an unreadable one raises ``fail(message)`` (one line)."""
    import pyarrow as pa

    path = Path(path)
    kind = {"parquet": "Parquet file", "arrow": "Arrow file",
            "hf_dataset": "Hugging Face dataset"}[fmt]
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pfile = pq.ParquetFile(path)
            return ArrowSource(path, pfile.schema_arrow,
                               lambda cols, rows: pfile.iter_batches(batch_size=rows,
                                                                     columns=cols))
        files = [path] if fmt == "arrow" else dataset_folder_files(path, fail)
        schemas = [_ipc_schema(f) for f in files]
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise fail(f"{path}: not a readable {kind} ({first})") from None
    if any(not s.equals(schemas[0]) for s in schemas[1:]):
        raise fail(f"{path}: its Arrow files do not share one schema")
    return ArrowSource(path, schemas[0], _ipc_batches(files))


def source_files(path: str | Path) -> list[Path]:
    """The files whose bytes are an input's content: the file itself, or a saved dataset's
    Arrow shards in row order (what a content digest hashes)."""
    path = Path(path)
    if path.is_dir():
        return dataset_folder_files(path, ValueError)
    return [path]
