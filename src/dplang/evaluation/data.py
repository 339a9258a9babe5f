"""Inputs of an evaluation: held-out real texts and one or more synthetic runs.

Rules (documented in ``docs/evaluation.md`` and repeated in every report):

* **Synthetic runs** are ``dplang generate`` outputs (JSONL, one generation per line) with the
  manifest ``OUT.manifest.json`` beside them (:class:`dplang.release.OutputPaths`), or any
  other text file :mod:`dplang.io` reads (column ``text``; no Top-k+ statistics then).
  Generations are put in ``group`` order (the JSONL is appended in completion order, which
  depends on concurrency and resumes), file order when there is no ``group``. A group holds
  one generation: a group on several lines with the same record each time (an older dplang
  appended a resumed population run's rerun to what the first attempt had written) is kept
  once and the repeats are counted (the report warns); a group with differing records is
  refused, since nothing says which one was released. An empty generated text is a
  legitimate (degenerate) output and is kept; a file whose texts are all empty is refused.
* **Real texts** are read with :func:`dplang.io.read_records`; blank or missing rows are
  skipped (and counted). They must be *held out*: when the real file is the generation's data
  file (same path or same SHA-256 as recorded in the run's private side file
  ``OUT.private.json``, or in the manifest of runs written before the public/private split),
  the selected real rows must not
  be references of any generation (``reference_ids``). Overlap is refused, or, with
  ``exclude_references=True``, the reference rows are skipped.
* **Sizes.** Every comparison uses the same number ``n`` of real and synthetic texts:
  ``n = min(n_real, n_synthetic of every run)`` (and ``num`` when given, which may not exceed
  what is available). The first ``n`` texts of each input, in the order above, are used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dplang.io import (
    ReadStats,
    ReferenceDataError,
    file_digest,
    iter_json_objects,
    read_records,
)
from dplang.release import OutputPaths

__all__ = [
    "EvaluationError",
    "RealTexts",
    "SyntheticRun",
    "align_sizes",
    "load_real",
    "load_synthetic",
]


class EvaluationError(ValueError):
    """Bad evaluation input; the message is one line, fit for ``error: ...``."""


@dataclass
class SyntheticRun:
    """One synthetic file (one seed / one run).

    Attributes:
        path: the file.
        texts: generated texts in ``group`` order (empty strings kept).
        records: the raw JSON objects (``{"text": ...}`` only for non-JSONL files), same order.
        manifest: the parsed manifest, or ``None`` when there is none.
        sha256: digest of the file.
        label: display name (default: the file name).
        private: the run's private side file (data path and digest), when readable; used
            only to recognise the generation's data file, never copied into a report.
        repeated_lines: lines dropped because they repeated a group's record exactly.
    """

    path: Path
    texts: list[str]
    records: list[dict[str, Any]]
    manifest: dict[str, Any] | None
    sha256: str
    label: str | None = None
    private: dict[str, Any] | None = None
    repeated_lines: int = 0

    @property
    def name(self) -> str:
        """A short label: :attr:`label`, else the file name."""
        return self.label or self.path.name

    @property
    def parameters(self) -> dict[str, Any]:
        """``manifest.fingerprint.parameters`` (empty without a manifest)."""
        if not self.manifest:
            return {}
        return dict((self.manifest.get("fingerprint") or {}).get("parameters") or {})

    def has_field(self, key: str) -> bool:
        """Whether every record carries ``key`` with a non-null value."""
        return bool(self.records) and all(r.get(key) is not None for r in self.records)

    def reference_ids(self) -> set[int]:
        """Union of the ``reference_ids`` of all generations (row indices of the data file)."""
        ids: set[int] = set()
        for record in self.records:
            ids.update(int(i) for i in record.get("reference_ids") or ())
        return ids

    def head(self, n: int) -> SyntheticRun:
        """The run cut to its first ``n`` generations."""
        return SyntheticRun(self.path, self.texts[:n], self.records[:n], self.manifest,
                            self.sha256, self.label, self.private, self.repeated_lines)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for lineno, obj in iter_json_objects(path, EvaluationError):
        text = obj.get("text")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise EvaluationError(f"{path}: line {lineno}: 'text' is not a string")
        obj["text"] = text
        records.append(obj)
    return records


def _one_per_group(path: Path, records: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], int]:
    """``records`` (sorted by group) with each group once, and how many lines repeated a
    group's record exactly; a group whose lines differ is refused."""
    kept: list[dict[str, Any]] = []
    repeated = 0
    for record in records:
        if kept and kept[-1]["group"] == record["group"]:
            if record != kept[-1]:
                raise EvaluationError(
                    f"{path}: group {record['group']} is on several lines with different "
                    "texts or fields; a generation file holds one generation per group, so "
                    "which one was released is unknown: keep the released line only")
            repeated += 1
            continue
        kept.append(record)
    return kept, repeated


def load_synthetic(path: str | Path) -> SyntheticRun:
    """Read one synthetic file and its manifest (if any); see the module docstring."""
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"synthetic file not found: {path}")
    repeated = 0
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        records = _read_jsonl(path)
        if records and all(isinstance(r.get("group"), int) for r in records):
            records.sort(key=lambda r: r["group"])
            records, repeated = _one_per_group(path, records)
    else:
        try:
            rows = read_records(path, "text", on_unusable="null")
            records = [{"text": r.text or ""} for r in rows]
        except ReferenceDataError as exc:
            raise EvaluationError(str(exc)) from None
    if not records:
        raise EvaluationError(f"{path}: no synthetic texts")
    if all(not r["text"].strip() for r in records):
        raise EvaluationError(f"{path}: all {len(records)} synthetic texts are empty")
    manifest = None
    paths = OutputPaths.of(path)  # a dplang output's manifest and side file, old names too
    mpath = paths.find_manifest()
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EvaluationError(f"{mpath}: cannot read the manifest ({exc})") from None
    private = None
    ppath = paths.find_private()
    if ppath.is_file():
        try:
            private = json.loads(ppath.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            private = None  # unreadable (e.g. another user's mode-600 file): not needed
    return SyntheticRun(path, [r["text"] for r in records], records, manifest, file_digest(path),
                        private=private, repeated_lines=repeated)


@dataclass
class RealTexts:
    """Held-out real texts selected for the evaluation.

    Attributes:
        path: the file.
        texts: the selected texts, in file order.
        indices: their row indices in the file (``Record.index``).
        stats: read statistics (rows seen, blank rows skipped, ...).
        sha256: digest of the file.
        excluded_references: reference rows skipped (``exclude_references=True``).
        is_generation_data: names of the synthetic files whose data file this is.
        exhausted: whether the whole file was read.
        labels: per requested label column (``label_columns`` of :func:`load_real`), the
            selected rows' values in the same order (``""`` where a row has none). Label
            columns are public by declaration.
    """

    path: Path
    texts: list[str]
    indices: list[int]
    stats: ReadStats
    sha256: str
    excluded_references: int = 0
    is_generation_data: list[str] = field(default_factory=list)
    exhausted: bool = True
    labels: dict[str, list[str]] = field(default_factory=dict)

    def head(self, n: int) -> RealTexts:
        """The first ``n`` selected texts (and their labels)."""
        return RealTexts(self.path, self.texts[:n], self.indices[:n], self.stats, self.sha256,
                         self.excluded_references, self.is_generation_data, self.exhausted,
                         {col: values[:n] for col, values in self.labels.items()})


def _is_data_file(real: Path, real_sha: str, run: SyntheticRun) -> bool:
    sources = [(run.private or {}).get("data") or {}]
    if run.manifest:  # runs written before the public/private split kept these in the manifest
        sources.append(run.manifest.get("data") or {})
        sources.append({"path": run.parameters.get("data")})
    for data in sources:
        if data.get("sha256") and data.get("sha256") == real_sha:
            return True
        recorded = data.get("path")
        if not recorded:
            continue
        try:
            if Path(recorded).resolve() == real.resolve():
                return True
        except OSError:
            continue
    return False


def load_real(
    path: str | Path,
    runs: Sequence[SyntheticRun],
    *,
    text_column: str = "text",
    limit: int | None = None,
    exclude_references: bool = False,
    label_columns: Sequence[str] = (),
) -> RealTexts:
    """Read up to ``limit`` held-out real texts, checking that they are not references, with
    the values of ``label_columns`` (public by declaration) of the selected rows.

    Raises :class:`EvaluationError` when the file cannot be read, holds no usable text, or
    (without ``exclude_references``) a selected row is a reference of one of ``runs``.
    """
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"real file not found: {path}")
    sha = file_digest(path)
    data_of = [run for run in runs if _is_data_file(path, sha, run)]
    forbidden: set[int] = set()
    for run in data_of:
        forbidden |= run.reference_ids()
    stats = ReadStats()
    texts: list[str] = []
    indices: list[int] = []
    labels: dict[str, list[str]] = {col: [] for col in label_columns}
    excluded = 0
    exhausted = True
    try:
        iterator = read_records(path, text_column, tuple(label_columns), on_unusable="skip",
                                stats=stats)
        for record in iterator:
            if exclude_references and record.index in forbidden:
                excluded += 1
                continue
            texts.append(record.text or "")
            indices.append(record.index)
            for col, values in labels.items():
                values.append(record.labels.get(col, ""))
            if limit is not None and len(texts) >= limit:
                exhausted = False
                break
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    except ReferenceDataError as exc:
        raise EvaluationError(str(exc).splitlines()[0]) from None
    if not texts:
        raise EvaluationError(f"{path}: no usable real texts in column {text_column!r}"
                              + (f" ({excluded} reference rows excluded)" if excluded else ""))
    overlap = sorted(set(indices) & forbidden)
    if overlap:
        names = ", ".join(run.name for run in data_of)
        raise EvaluationError(
            f"{path} is the data file of {names} and {len(overlap)} of the selected real rows "
            f"(first: row {overlap[0]}) were references of the generation; evaluate against "
            "held-out texts, or pass --exclude-references to skip the reference rows"
        )
    return RealTexts(path, texts, indices, stats, sha, excluded,
                     [run.name for run in data_of], exhausted, labels)


def align_sizes(
    real: RealTexts, runs: Sequence[SyntheticRun], num: int | None = None
) -> tuple[int, RealTexts, list[SyntheticRun]]:
    """Cut the real texts and every run to a common size ``n`` (see the module docstring).

    ``num`` (optional) is the requested size; it may not exceed what every input provides.
    Returns ``(n, real_head, [run_head, ...])``.
    """
    available = min([len(real.texts), *(len(r.texts) for r in runs)])
    if num is not None:
        if num < 1:
            raise EvaluationError(f"--num must be at least 1, got {num}")
        if num > available:
            parts = [f"{len(real.texts)} real"] + [f"{len(r.texts)} in {r.name}" for r in runs]
            raise EvaluationError(
                f"--num {num} is more than the texts available ({', '.join(parts)})"
            )
        n = num
    else:
        n = available
    return n, real.head(n), [r.head(n) for r in runs]
