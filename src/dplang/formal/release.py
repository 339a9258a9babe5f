"""``--data`` runs of the formal lab: a user's sample is private data, so running an algorithm
on it is a real release through the shared pipeline (:mod:`dplang.release`).

:func:`read_elements` parses the file (one element per line: a JSON value — an integer, a
string, a pair [x, y] — or the raw line as a string), :func:`custom_collection` reads a public
collection of regular languages from JSON (complete DFAs only), and :func:`release_on_data`
does the release: the guarantee is fixed from public inputs (algorithm, parameters, n), the
ledger is charged *before* anything is written (DESIGN invariant 6), then the output
``DIR/results.csv``, the public manifest ``DIR/results.manifest.json`` (parameters, n, guarantee
— no seed, no data digest or path) and the private side file
``DIR/.dplang-private/results.private.json`` (mode 600: dataset name, data digest and path,
release id) are written atomically (:class:`dplang.release.OutputPaths`).

Privacy contract: the released output satisfies the algorithm's guarantee with respect to
replacing one element of the file (n public); everything written outside the output is a
function of public inputs, or private (mode 600).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..privacy.accounting import check_budget_limit
from ..privacy.randomness import RandomStreams
from ..release import (
    OutputPaths,
    Release,
    ReleaseError,
    RunLock,
    check_output_path,
    fsync_dir,
)
from .collections import Collection, finite_collection
from .languages import DFALanguage, dfa_language
from .limit import (
    ApproximateIntersectionGenerator,
    EpochEMIdentifier,
    StochasticIdentifier,
    UniformPrivateGenerator,
    UPGContinual,
)
from .statistical import Unmaterialised
from .streams import ExplicitStream
from .universe import CantorPairs, FiniteUniverse, Naturals, Shortlex, Universe

__all__ = ["FormalDataError", "ReleaseOutcome", "custom_collection", "data_lines",
           "read_elements", "release_on_data"]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class FormalDataError(ValueError):
    """Bad ``--data`` or ``--collection`` input (one-line message)."""


def _digits_to_int(digits: str) -> int:
    """A string of decimal digits as an int, however many (Python refuses ``int()`` of more
    than 4,300 digits at once: sys.get_int_max_str_digits)."""
    value = 0
    for start in range(0, len(digits), 4000):
        chunk = digits[start:start + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _parse(line: str, universe: Universe) -> Any:
    raw = line.rstrip("\n")
    if raw.isascii() and raw.isdigit() and (raw == "0" or not raw.startswith("0")):
        value: Any = _digits_to_int(raw)  # a JSON integer, of any length
    else:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
    if isinstance(universe, Naturals):
        if isinstance(value, str) and value in universe.noise:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FormalDataError(f"{raw!r} is not a natural number")
        return value
    if isinstance(universe, Shortlex):
        if not isinstance(value, str):
            value = raw
        universe.index(value)
        return value
    if isinstance(universe, CantorPairs):
        if not (isinstance(value, list) and len(value) == 2):
            raise FormalDataError(f"{raw!r} is not a pair [x, y]")
        pair = (value[0], value[1])
        universe.index(pair)
        return pair
    if isinstance(universe, FiniteUniverse):
        for cand in (value, raw):
            if universe.contains(cand):
                return cand
        raise FormalDataError(f"{raw!r} is not an element of {universe.describe()}")
    raise FormalDataError(f"unsupported universe {universe.describe()}")


def data_lines(text: str) -> list[str]:
    """The records of a ``--data`` file: its lines as every dplang reader splits them, at
    ``\n`` only (a ``\r\n`` ending is a line ending too), after a UTF-8 byte-order mark.

    Never ``str.splitlines``, which also splits at ``\r``, form feeds, ``\x1c``-``\x1e``,
    U+0085, U+2028 and U+2029: one record holding one of them would count as two, and the
    public n of a neighbouring file would differ."""
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line ending
    return [line.removesuffix("\r") for line in lines]


def read_elements(path: Path, universe: Universe) -> list[Any]:
    """Read one element per line (:func:`data_lines`); FormalDataError (one line) for anything
    unreadable."""
    try:  # bytes, decoded: a text-mode read would turn a lone "\r" into a line break
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FormalDataError(f"cannot read --data {path}: {exc}") from None
    lines = data_lines(text)
    if not lines:
        raise FormalDataError(f"--data {path} is empty")
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(_parse(line, universe))
        except (ValueError, TypeError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FormalDataError(f"--data {path}, line {i}: {msg}") from None
    return out


def custom_collection(path: Path) -> Collection:
    """A public finite collection of regular languages from JSON:
    ``{"name": ..., "alphabet": "ab", "languages": [{"name": ..., "transitions":
    {state: {letter: next}}, "start": s, "accept": [...]}, ...]}``. Partial DFAs are refused."""
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormalDataError(f"cannot read --collection {path}: "
                              f"{str(exc).splitlines()[0]}") from None
    try:
        alphabet = spec["alphabet"]
        langs: list[DFALanguage] = []
        for i, lang in enumerate(spec["languages"], 1):
            langs.append(dfa_language(alphabet, lang["transitions"], lang["start"],
                                      lang["accept"], lang.get("name", f"L{i}")))
    except (KeyError, TypeError) as exc:
        raise FormalDataError(f"--collection {path}: missing or malformed field {exc}") \
            from None
    except ValueError as exc:
        raise FormalDataError(f"--collection {path}: {str(exc).splitlines()[0]}") from None
    if not langs:
        raise FormalDataError(f"--collection {path} has no languages")
    return finite_collection(str(spec.get("name", path.stem)), langs)


def collection_digest(collection: Collection) -> str | None:
    """sha256 of what a finite collection's languages are (each DFA's alphabet, transitions,
    start and accepting states, with its name); None for a countable collection, which only
    dplang's own code builds (its name and the version identify it). In the fingerprint: a
    collection edited in place under the same name and size is another release (a new
    charge), never a free rerun with the same noise."""
    if not collection.is_finite:
        return None
    parts: list[Any] = []
    for i in range(1, int(collection.size or 0) + 1):
        lang = collection[i]
        dfa = getattr(lang, "dfa", None)
        parts.append([lang.name, "dfa", list(dfa.alphabet), [list(r) for r in dfa.delta],
                      dfa.start, sorted(dfa.accept)] if dfa is not None
                     else [lang.name, type(lang).__name__, lang.describe()])
    blob = json.dumps(parts, default=str, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class ReleaseOutcome:
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    paths: OutputPaths


def _describe(out: Any) -> str:
    if isinstance(out, Unmaterialised):
        return str(out)
    if hasattr(out, "describe"):
        return out.describe()
    if isinstance(out, str):
        return out
    return json.dumps(out if not isinstance(out, tuple) else list(out), default=str)


def release_on_data(alg: Any, collection: Collection, data_path: Path, out: Path,
                    parameters: dict[str, Any], *, seed: int | None = None,
                    dataset: str | None = None, ledger: str | Path | None = None,
                    on_warning: Any = None) -> ReleaseOutcome:
    """Run a private algorithm once on the elements of ``data_path`` as a charged release.

    Statistical (000) algorithms treat the file as the sample S (n = its length, public);
    limit (001) algorithms treat it as the stream x_1..x_n and release their transcript up to
    n (the uniform private generator one-shot releases one string).

    Privacy contract: see the module docstring. Non-private algorithms are refused."""
    if not getattr(alg, "private", True) or math.isinf(getattr(alg, "epsilon", 1.0)):
        raise ReleaseError(f"{alg.name} is not private: it cannot run on --data")
    check_budget_limit(getattr(alg, "epsilon", None), name="--epsilon")
    if hasattr(alg, "check"):  # a public property of the collection: refused before the data
        alg.check(collection)  # is read, and before the charge
    check_output_path(out, directory=True)
    # an empty folder given through a symbolic link: the folder is the one replaced, and the
    # one locked (a run into the link and one into the folder itself are one --out)
    target = out.resolve() if out.is_symlink() else out
    with RunLock(target):  # one process per --out, from before the data is read
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ReleaseError(f"{out} already exists; choose another --out")
        return _release_locked(alg, collection, data_path, target, parameters, seed=seed,
                               dataset=dataset, ledger=ledger, on_warning=on_warning)


def _release_locked(alg: Any, collection: Collection, data_path: Path, out: Path,
                    parameters: dict[str, Any], *, seed: int | None, dataset: str | None,
                    ledger: str | Path | None, on_warning: Any) -> ReleaseOutcome:
    elements = read_elements(data_path, collection.universe)
    n = len(elements)
    guarantee = alg.guarantee(n)
    fingerprint = {"algorithm": alg.name, "paper": getattr(alg, "paper", ""),
                   "collection": collection.describe(),
                   "collection_sha256": collection_digest(collection),
                   "parameters": parameters, "n": n}
    release = Release.open("formal run", data=data_path, guarantee=guarantee,
                           fingerprint=fingerprint, dataset=dataset, seed=seed, ledger=ledger,
                           description=f"dplang formal run {alg.name} → {out}")
    # The folder is filled under a hidden name, mode 700 (nobody else can enter it or stat
    # what it holds), and renamed into place whole: --out never shows results without their
    # manifest, and a folder that cannot be made is found before the charge.
    staging = _staging_folder(out)
    try:
        with release.stops_reported([]):  # what a stop left (nothing is written before the end)
            try:
                manifest, rows = _charge_and_write(alg, collection, elements, parameters,
                                                   release, staging, on_warning)
                _publish_folder(staging, out, release.opened)
            except BaseException:
                _remove_staging(staging)  # (gone once renamed into place)
                raise
    except KeyboardInterrupt:
        if not staging.exists() and (out / "results.csv").exists():  # renamed: complete
            raise KeyboardInterrupt(f"interrupted after the end: the release was charged and "
                                    f"{out} holds all its files") from None
        raise
    return ReleaseOutcome(manifest, rows, OutputPaths.of(out / "results.csv"))


def _charge_and_write(alg: Any, collection: Collection, elements: list[Any],
                      parameters: dict[str, Any], release: Release, staging: Path,
                      on_warning: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Charge the release, run the algorithm and write its files into ``staging``."""
    from .experiments import rows_to_csv

    n = len(elements)
    release.charge(on_warning)  # before anything is written (DESIGN invariant 6)
    rows = _run(alg, collection, elements, n, release)
    staged = OutputPaths.of(staging / "results.csv")
    release.write_private(staged, release.private_record(keep_seed=False,
                                                         data={"elements": n}))
    manifest = release.public_manifest(algorithm=alg.name, parameters=parameters,
                                       collection=collection.describe(), n=n,
                                       n_rule="n = the number of elements (public under "
                                              "replace-one adjacency)",
                                       output_file=staged.output.name)
    release.write_output(staged.output, rows_to_csv(rows))
    release.write_manifest(staged, manifest)
    return manifest, rows


def _staging_folder(out: Path) -> Path:
    """A new hidden folder beside ``out`` (mode 700) where its files are written. Called
    under ``out``'s lock: a staging folder of ``out`` left by a process killed outright
    (``kill -9``, a power cut: its release charged, never published) is removed first."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_staging(out)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as exc:
        raise ReleaseError(f"--out {out} cannot be created ({exc.strerror or exc})") from None


def _remove_dead_staging(out: Path) -> None:
    """Remove the staging folders of ``out`` (``.NAME.XXXXXXXX.partial``, the 8 characters
    ``tempfile.mkdtemp`` draws, so never another --out's such as ``NAME.b``'s). Only under
    ``out``'s lock: no live process writes one."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}\.partial")
    for entry in os.scandir(out.parent):
        if pattern.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            _remove_staging(Path(entry.path))


def _remove_staging(staging: Path) -> None:
    """Remove a staging folder, made writable first (it may already hold the mode of a
    read-only --out it was to replace)."""
    with contextlib.suppress(OSError):
        os.chmod(staging, 0o700)
    shutil.rmtree(staging, ignore_errors=True)


def _publish_folder(staging: Path, out: Path, opened: float) -> None:
    """Give ``staging`` the mode of the empty folder ``out`` it replaces, or else the mode a
    new folder gets (the umask's), and the release's opening time, and rename it to ``out``
    (absent, or an empty folder: checked under the lock)."""
    if out.is_dir():
        was = out.stat()
        mode = was.st_mode & 0o7777
        if staging.stat().st_gid != was.st_gid:
            try:  # its group too (a team's folder): the mode's group bits are for that group
                os.chown(staging, -1, was.st_gid)
            except OSError:  # not ours to give: no group access, rather than another group's
                mode &= ~0o2070
    else:
        mask = os.umask(0)
        os.umask(mask)
        # a setgid parent's bit, which a new folder inherits (as mkdir's would), stays
        mode = (0o777 & ~mask) | (staging.stat().st_mode & 0o2000)
    os.chmod(staging, mode)
    os.utime(staging, (opened, opened))
    os.rename(staging, out)  # onto an empty folder too (POSIX)
    fsync_dir(out.parent)


def _run(alg: Any, collection: Collection, elements: list[Any], n: int,
         release: Release) -> list[dict[str, Any]]:
    """The algorithm's released rows, its noise from the release's streams."""
    stream_alg = isinstance(alg, ApproximateIntersectionGenerator | EpochEMIdentifier
                            | StochasticIdentifier | UPGContinual)
    rng = RandomStreams(release.stream_seed).generator(0)  # fresh for every release
    rows: list[dict[str, Any]] = []
    if stream_alg:
        stream = ExplicitStream(elements, collection.universe, name="data")
        res = alg.run(stream, collection, n, rng)
        for seg in res.segments:
            rows.append({"from_t": seg.start, "to_t": seg.end, "output": _describe(
                seg.output if not isinstance(seg.output, int) else collection[seg.output]),
                "index": seg.output if isinstance(seg.output, int) else ""})
    elif isinstance(alg, UniformPrivateGenerator):
        w, subset, u = alg.run(np.asarray(elements, dtype=object), collection, rng)
        rows.append({"output": _describe(w), "subset": format(subset, "b"),
                     "closure": u.describe()})
    else:
        arr = (np.asarray(elements, dtype=np.int64) if all(
            isinstance(e, int) and _INT64_MIN <= e <= _INT64_MAX for e in elements)
               else np.asarray(elements, dtype=object))
        sel = alg.run(arr, collection, rng)
        rows.append({"index": sel.index, "output": _describe(sel.output),
                     "threshold": "" if sel.threshold is None else sel.threshold})
    return rows
