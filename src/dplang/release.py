"""The release pipeline: every command that publishes something computed from private data.

One order of work for ``generate``, ``report``, ``sample`` and later commands (``docs/privacy.md``
invariants 6 and 8; "Public and private files (the release pipeline)")::

    plan        the command validates its parameters and reads the data; writes nothing
    Release     fixes the dataset name (ledger key), the content digest, the seed and the
                release id = H(command, public fingerprint, dataset name, content digest, seed)
    streams     the release's random streams are rooted at H(seed, release id)
                (:attr:`Release.stream_seed`): fresh noise for every release, whatever seed
                is passed, so two releases never share (and cancel) their noise
    opening     a resumable run (``generate --out``) first writes its private side file
                with the seed (``Release.opening_record``, mode 600, private folder): a stop
                inside the charge keeps the seed of a release the ledger may hold
    charge()    records the release in the ledger BEFORE any output; refuses over budget, and
                refuses a seed already used for another release of the dataset
    outputs     the private side file (mode 600 from creation, in a folder only its owner can
                enter: :data:`PRIVATE_DIR`), the public manifest and the released content,
                each written atomically (temporary file, fsync, rename, directory fsync) or
                appended line by line with fsync (resumable outputs)

What is public and what is private (``docs/privacy.md``, "Public and private files"):

* the **public manifest** (``Release.public_manifest``) holds only functions of public inputs:
  parameters, the guarantee, model id and digest, versions, the public fingerprint, timestamps.
  Nothing computed from the private rows: no content digest, no counts of used / blank /
  truncated / unusable rows, no per-record cost, no data path, no dataset name, no seed.
* the **private side file** (``Release.private_record``, written with mode 600 from creation)
  holds what the data holder needs and nobody else may see: the seed where a run must be
  resumable, the content digest, the dataset name, counts, paths, the release id. It lives in
  the folder :data:`PRIVATE_DIR` beside the output, mode 700 from creation: a mode-600 file in
  a folder others may search still shows its size (and times) to ``stat``, and the size of a
  side file tells neighbouring datasets apart (a count of blank rows has more digits, a reason
  appears only when a row has it). In a folder only the owner can enter, nothing about it is
  visible (:func:`private_dir`).

A release is identified by what determines its output: the public fingerprint, the dataset
name, the content digest and the seed. The same command with the same seed on the same data is
the same release (charged once: its output is identical); a new seed is a new release and a new
charge (or a refusal when over budget). A fixed seed makes a release reproducible, nothing more:
its noise is drawn from streams rooted at H(seed, release id), so a seed reused for another
release (other parameters, other statements, edited data) gives independent noise — and the
ledger refuses such a reuse for the same dataset anyway
(:class:`~dplang.privacy.ledger.SeedReused`).

Library use::

    release = Release.open("mycommand", data=path, guarantee=g, fingerprint=params,
                           dataset=None, seed=None, ledger=None)
    release.charge()                                   # raises BudgetExceeded
    paths = OutputPaths.of(out_path)                   # output, manifest, side file, lock
    release.write_private(paths, release.private_record(keep_seed=False, rows=n))
    release.write_manifest(paths, release.public_manifest(extra="..."))
    release.write_output(paths.output, text)           # refused before charge()

Size: the release pipeline (open, charge, private side file, manifest, append log, run lock) is
one ordered protocol every command follows.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from . import __version__
from .io import file_digest
from .privacy.guarantees import Guarantee
from .privacy.ledger import BudgetExceeded, PrivacyLedger, SeedReused
from .privacy.ledger_backends import backend_for, ledger_location
from .utf8 import utf8_refusal

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_SUFFIX",
    "OPENED_STAGE",
    "PRIVATE_DIR",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FORMAT",
    "PRIVATE_MODE",
    "PRIVATE_SUFFIX",
    "TIMESTAMP_FIELDS",
    "AppendLog",
    "BudgetExceeded",
    "Charge",
    "OutputPaths",
    "Release",
    "ReleaseError",
    "RunLock",
    "RunLocked",
    "SeedReused",
    "check_output_path",
    "dataset_key",
    "dataset_name",
    "fresh_seed",
    "fsync_dir",
    "ledger_name",
    "make_release_id",
    "make_seed_tag",
    "make_stream_seed",
    "output_label",
    "private_dir",
    "publish",
    "write_atomic",
    "write_json",
]

MANIFEST_FORMAT = "dplang.manifest/1"
PRIVATE_FORMAT = "dplang.private/1"
#: Mode of every private file (side files, copies of references), set at creation.
PRIVATE_MODE = 0o600
#: Mode of every folder that holds private files: only its owner may list it or ``stat``
#: anything in it (a mode-600 file's size is visible to anyone who may search its folder).
PRIVATE_DIR_MODE = 0o700
#: The folder, beside an output, that holds its private side files (mode 700 from creation).
PRIVATE_DIR = ".dplang-private"
#: Suffix of an unfinished resumable output in the private folder (:attr:`OutputPaths.partial`).
PARTIAL_SUFFIX = ".partial"
#: Suffix of :attr:`OutputPaths.replacement` (after the output's whole name).
REPLACING_SUFFIX = ".replacing.json"
#: Public-manifest fields that hold wall-clock times (the only fields allowed to differ between
#: runs on neighbouring datasets besides the released content). Each is taken *before* the
#: release's computation on the private data (when the :class:`Release` is opened, or when a
#: generation starts), never after it: an end time or a duration would publish how long the
#: computation on the private rows took (a timing side channel), so none is written into a
#: public file (durations go to private files, mode 600, or to the terminal).
TIMESTAMP_FIELDS = ("created", "started")
#: ``stage`` of a private side file written before its run's charge
#: (:meth:`Release.opening_record`); a side file without it is a charged run's.
OPENED_STAGE = "opened"
PRIVATE_NOTE = ("PRIVATE: not part of the release; never publish this file. It holds the data's "
                "digest and counts, and may hold the secret seed (knowing it voids the privacy "
                "guarantee).")


class ReleaseError(ValueError):
    """A release cannot go ahead as asked (one-line message); nothing was written."""


# ---------------------------------------------------------------------------------------------
# Durable writes


def fsync_dir(directory: str | Path) -> None:
    """fsync a directory so that a rename or a new file in it survives a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems that refuse directory fsync
        pass
    finally:
        os.close(fd)


def private_dir(folder: str | Path) -> Path:
    """``folder`` as a folder only its owner can enter: created with mode 700 (parents as
    usual), or, when it exists, checked to be a real folder of this user and tightened to 700.
    Raises :class:`ReleaseError` for a file, a symbolic link or another user's folder (whoever
    owns it could read what is put there).

    Privacy contract: another user can neither list the folder nor ``stat`` anything in it,
    so the size, times and existence of the private files it holds say nothing to them."""
    folder = Path(folder)
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            os.mkdir(folder, PRIVATE_DIR_MODE)  # the umask can only remove bits
        fsync_dir(folder.parent)
        st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise ReleaseError(f"{folder} must be a folder for private files, not a file or link")
    if st.st_uid != os.geteuid():
        raise ReleaseError(f"{folder} belongs to another user: private files cannot be kept "
                           "there")
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(folder, PRIVATE_DIR_MODE)
    return folder


MANIFEST_SUFFIX = ".manifest.json"
PRIVATE_SUFFIX = ".private.json"


@dataclass(frozen=True)
class OutputPaths:
    """The files that belong to one output ``DIR/NAME.EXT``: the one naming scheme of every
    command (``docs/privacy.md``, "Public and private files")::

        output    DIR/NAME.EXT                              released content
        manifest  DIR/NAME.manifest.json                    public manifest
        private   DIR/.dplang-private/NAME.private.json     private side file (mode 600, in
                                                            a folder of mode 700)
        partial   DIR/.dplang-private/NAME.EXT.partial      a resumable output while it grows
        replacement DIR/.dplang-private/NAME.EXT.replacing.json  the opening of a run that
                                                            replaces this one (--overwrite)
        lock      DIR/.NAME.EXT.lock                        while a process writes the output

    ``NAME`` is the output's name without its last suffix (``runs/x.jsonl`` → ``x``,
    ``samples.csv`` → ``samples``, ``report.json`` → ``report``); the lock is named after the
    whole name, so it also serves a folder (``dplang evaluate --out DIR``).

    Older dplang versions wrote some of these files under other names (:attr:`legacy_manifests`,
    :attr:`legacy_privates`): ``dplang sample`` named them after the whole output name
    (``samples.csv.manifest.json``, ``.dplang-private/samples.csv.private.json``), and every
    command once kept its side file beside the output. They are still read
    (:meth:`find_manifest`, :meth:`find_private`), count as existing outputs
    (:meth:`existing`), move into place when a run resumes (:meth:`adopt_legacy_private`) and
    are removed when the output is replaced (:meth:`Release.write_private`,
    :meth:`Release.write_manifest`).

    Privacy contract: none by itself; the private side file's folder is made by
    :func:`private_dir` when it is written (:func:`write_atomic` with ``private=True``)."""

    output: Path
    manifest: Path
    private: Path
    lock: Path

    @classmethod
    def of(cls, output: str | Path) -> OutputPaths:
        """The files of ``output`` (see the class docstring)."""
        output = Path(output)
        stem = output.name.removesuffix(output.suffix)
        return cls(output, output.with_name(stem + MANIFEST_SUFFIX),
                   output.parent / PRIVATE_DIR / (stem + PRIVATE_SUFFIX),
                   output.with_name(f".{output.name}.lock"))

    @property
    def partial(self) -> Path:
        """Where a resumable output grows while its run computes
        (``DIR/.dplang-private/NAME.EXT.partial``, mode 600 in the private folder): nobody
        else can see it grow or ``stat`` it; :func:`publish` moves it to :attr:`output` when
        the run is complete."""
        return self.private.parent / (self.output.name + PARTIAL_SUFFIX)

    @property
    def replacement(self) -> Path:
        """The opening side file of a run that replaces this output (``--overwrite``),
        written before its charge while the earlier run's files stay
        (``DIR/.dplang-private/NAME.EXT.replacing.json``, mode 600): it keeps the new seed
        until it takes :attr:`private`'s place, right after the charge."""
        return self.private.parent / (self.output.name + REPLACING_SUFFIX)

    @property
    def legacy_manifests(self) -> tuple[Path, ...]:
        """Where an older dplang put the public manifest (``NAME.EXT.manifest.json``)."""
        return self._others(self.manifest, self.output.with_name(self.output.name
                                                                 + MANIFEST_SUFFIX))

    @property
    def legacy_privates(self) -> tuple[Path, ...]:
        """Where an older dplang put the private side file: named after the whole output name
        in the private folder, or beside the output, in a folder others could search."""
        name, stem = self.output.name, self.private.name
        return self._others(self.private, self.private.with_name(name + PRIVATE_SUFFIX),
                            self.output.with_name(stem),
                            self.output.with_name(name + PRIVATE_SUFFIX))

    def _others(self, current: Path, *candidates: Path) -> tuple[Path, ...]:
        """The legacy ``candidates`` but ``current``. A legacy name ``NAME.EXT.…`` is also the
        current name of the files of an output ``NAME.EXT.E`` (``x.jsonl``'s legacy manifest
        ``x.jsonl.manifest.json`` is ``x.jsonl.jsonl``'s manifest): while such an output
        exists or grows, those names are its, never this output's."""
        taken = self._sibling_exists()
        prefix = self.output.name + "."
        return tuple(p for p in dict.fromkeys(candidates)
                     if p != current and not (taken and p.name.startswith(prefix)))

    def _sibling_exists(self) -> bool:
        """Whether another output ``NAME.EXT.E`` is published beside this one or grows in the
        private folder (its partial file ``NAME.EXT.E.partial``)."""
        prefix = self.output.name + "."
        own = {self.output.name + MANIFEST_SUFFIX, self.output.name + PRIVATE_SUFFIX,
               self.partial.name}
        for folder, suffix in ((self.output.parent, ""), (self.private.parent, PARTIAL_SUFFIX)):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            if any(n.startswith(prefix) and n.endswith(suffix) and n not in own
                   for n in names):
                return True
        return False

    @staticmethod
    def _find(current: Path, legacy: tuple[Path, ...]) -> Path:
        if current.exists():
            return current
        return next((p for p in legacy if p.exists()), current)

    def find_manifest(self) -> Path:
        """:attr:`manifest`, or the legacy manifest an older dplang wrote when only that
        exists."""
        return self._find(self.manifest, self.legacy_manifests)

    def find_private(self) -> Path:
        """:attr:`private`, or the legacy side file an older dplang wrote when only that
        exists."""
        return self._find(self.private, self.legacy_privates)

    def existing(self) -> list[Path]:
        """The files of this output that exist, legacy names included."""
        paths = (self.output, self.manifest, *self.legacy_manifests, self.private,
                 *self.legacy_privates, self.partial)
        return [p for p in paths if p.exists()]

    def remove(self, *, keep_private: bool = False) -> None:
        """Remove the output, its manifest, its private side file and an unfinished output,
        legacy names included (``--overwrite``, once the new release is charged);
        ``keep_private`` keeps :attr:`private` (its legacy copies go)."""
        for path in (self.output, self.manifest, *self.legacy_manifests,
                     *(() if keep_private else (self.private,)), *self.legacy_privates,
                     self.partial):
            path.unlink(missing_ok=True)

    def take_replacement(self) -> None:
        """Once the replacing run is charged: the earlier run's public and unfinished files
        go, then its :attr:`replacement` takes :attr:`private`'s place (one rename). A stop
        between the two leaves the earlier side file without outputs beside the replacement;
        the replacing command continues from the replacement (``dplang.textgen.resume``)."""
        self.adopt_legacy_private()  # an older dplang's side file, kept under its own name
        self.remove(keep_private=True)
        os.replace(self.replacement, self.private)
        fsync_dir(self.private.parent)

    def adopt_legacy_private(self) -> None:
        """Move a side file that an older dplang left under a legacy name into
        :attr:`private` (a resumed run keeps its side file, now in the private folder)."""
        found = self.find_private()
        if found != self.private:
            private_dir(self.private.parent)
            os.replace(found, self.private)
            fsync_dir(self.private.parent)
            fsync_dir(found.parent)


def _remove_dead_writers_files(path: Path) -> None:
    """Remove the temporary files of ``path`` (``.NAME.PID.HEX.tmp``) that a process killed
    inside :func:`write_atomic` left (``kill -9`` runs no clean-up): those whose process is
    gone. A live process's, or one this process may not signal, is kept."""
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d+)\.[0-9a-f]{8}\.tmp")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        found = pattern.fullmatch(name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                (path.parent / name).unlink()
        except (PermissionError, OverflowError, OSError):
            continue


def write_atomic(path: str | Path, data: str | bytes, *, private: bool = False,
                 times: float | None = None) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory (mode 600
    from creation when ``private``), flushed and fsynced, renamed over ``path``, then the
    directory fsynced. A reader sees the old file or the new one, never a torn one. A private
    file whose folder is a :data:`PRIVATE_DIR` gets that folder as :func:`private_dir` makes
    it (mode 700). With ``times`` the file's access and modification times are set to it
    before the rename (a public file written after a computation on private data carries the
    release's public start time, not the end of the computation).

    Privacy contract: none by itself; ``private=True`` guarantees the bytes are never readable
    by others at any moment (the mode is set by ``os.open``, not by a later chmod)."""
    path = Path(path)
    if private and path.parent.name == PRIVATE_DIR:
        private_dir(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    _remove_dead_writers_files(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if times is not None:
            os.utime(tmp, (times, times))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: str | Path, obj: Mapping[str, Any], *, private: bool = False,
               times: float | None = None) -> None:
    """:func:`write_atomic` of ``obj`` as indented, key-sorted JSON (one trailing newline)."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    write_atomic(path, text, private=private, times=times)


#: Prefix of the private temporary folder that holds an API call's files when it is given no
#: ``out=`` (:func:`dplang.api.outputs.output_location`): nothing of it is kept.
TEMPORARY_RUN_PREFIX = "dplang-run-"


def is_temporary_output(path: str | Path) -> bool:
    """Whether ``path`` is an API call's temporary output (removed when the call returns:
    it can never be resumed)."""
    path = Path(path)
    try:
        inside = path.resolve().parent.parent == Path(tempfile.gettempdir()).resolve()
    except OSError:
        inside = False
    return inside and path.parent.name.startswith(TEMPORARY_RUN_PREFIX)


def output_label(path: str | Path) -> str:
    """How a release's ledger description names its output: the path, or, for an API call's
    temporary file (removed when the call returns), that nothing was kept."""
    return "returned in memory (no out=)" if is_temporary_output(path) else str(path)


def publish(staging: str | Path, target: str | Path, data: str | bytes, *,
            times: float) -> None:
    """Publish a finished output at once: ``data`` (the output's final bytes, typically the
    staged file's lines put in a canonical order) is written atomically to ``target`` with
    its access and modification times set to ``times`` (the release's public start time),
    then the staged file (``OutputPaths.partial``) is removed.

    Privacy contract: while a run computes, its output grows only in the private folder
    (mode 700), where nobody else can watch it or ``stat`` it; the public file appears once,
    with the start time as its modification time. What an observer can still see is its
    change time (``st_ctime``, set by the kernel at the rename: the end of the run) and the
    folders' times: docs/privacy.md, "What file times show"."""
    write_atomic(target, data, times=times)
    Path(staging).unlink(missing_ok=True)
    fsync_dir(Path(staging).parent)


class AppendLog:
    """A line-oriented output appended one line at a time, each line flushed and fsynced, so a
    crash loses no finished line (resumable outputs such as ``generate``'s JSONL). The file is
    created (mode 600 when ``private``) and its directory fsynced on first open."""

    def __init__(self, path: str | Path, *, private: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     PRIVATE_MODE if private else 0o666)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        if created:
            fsync_dir(self.path.parent)

    def write_line(self, line: str) -> None:
        """Append ``line`` and a newline; durable when this returns."""
        self._fh.write(line.rstrip("\n") + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Output paths and the run lock


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the folder a new output is created in)."""
    current = path
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def check_output_path(path: str | Path, *, what: str = "--out", directory: bool = False) -> None:
    """Refuse (one-line :class:`ReleaseError`), before anything runs, an output that cannot be
    written: an existing path of the wrong kind (a folder where a file goes, or the reverse),
    an existing file that is not writable, or a path whose folder cannot be created because an
    ancestor is a file or not writable. Creates nothing."""
    path = Path(path)
    if os.path.lexists(path):
        if directory and not path.is_dir():
            raise ReleaseError(f"{what} {path} is an existing file, not a folder")
        if not directory and path.is_dir():
            raise ReleaseError(f"{what} {path} is an existing folder, not a file")
        if not os.access(path, os.W_OK):
            raise ReleaseError(f"{what} {path} is not writable")
        return
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        raise ReleaseError(f"{what} {path} cannot be created: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ReleaseError(f"{what} {path} cannot be created: {ancestor} is not writable")


class RunLocked(ReleaseError):
    """Another process holds the lock on this output (one-line message)."""


class RunLock:
    """An exclusive lock on one run's output, so that two processes never write it together.

    The lock is :func:`fcntl.flock` on a lock file beside the output (:attr:`OutputPaths.lock`),
    taken without waiting: a second process is refused at once with :class:`RunLocked`. The
    kernel drops a flock when its process ends, however it ends (``kill -9`` included), so a
    lock file left by a crash is harmless: the next run takes it. A released lock removes its
    file, and the folders it had to create for it when they are still empty, so a run that
    stops before writing anything leaves nothing behind.

    Re-entrant within a process: the command line takes the lock before the (slow) model load
    and the library takes it again around the charge and the writes."""

    _held: ClassVar[dict[str, list[Any]]] = {}

    def __init__(self, out: str | Path, *, what: str = "--out") -> None:
        self.out = Path(out)
        self.path = OutputPaths.of(self.out).lock
        self.what = what
        self._key = str(self.path.absolute())
        self._acquired = False

    def acquire(self) -> RunLock:
        """Take the lock (or join this process's hold on it); raises :class:`RunLocked`."""
        held = RunLock._held.get(self._key)
        if held is not None:
            held[1] += 1
            self._acquired = True
            return self
        created: list[Path] = []
        folder = self.path.parent
        while not folder.exists():
            created.append(folder)
            folder = folder.parent
        for d in reversed(created):
            try:
                d.mkdir()
            except FileExistsError:
                pass
            except OSError as exc:
                self._remove_dirs(created)
                raise ReleaseError(f"{self.what} {self.out}: cannot create {d} ({exc.strerror})"
                                   ) from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
            except OSError as exc:
                self._remove_dirs(created)
                raise ReleaseError(f"{self.what} {self.out}: cannot create the lock file "
                                   f"{self.path} ({exc.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                raise RunLocked(
                    f"{self.out} is being written by another dplang process"
                    + (f" (pid {holder})" if holder else "")
                    + f"; wait for it to finish or choose another {self.what}") from None
            # a holder that released in between may have unlinked the file we opened
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        RunLock._held[self._key] = [fd, 1, created]
        self._acquired = True
        return self

    def release(self) -> None:
        """Give up this hold; the last one unlocks, removes the lock file and the folders
        created for it that are still empty."""
        if not self._acquired:
            return
        self._acquired = False
        held = RunLock._held.get(self._key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del RunLock._held[self._key]
        fd, _depth, created = held
        try:
            self.path.unlink(missing_ok=True)  # while still holding the lock
        finally:
            os.close(fd)
        self._remove_dirs(created)

    @staticmethod
    def _remove_dirs(created: list[Path]) -> None:
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Identity of a release


def fresh_seed() -> int:
    """A fresh secret 128-bit seed from the operating system's entropy."""
    return secrets.randbits(128)


def require_utf8(what: str, text: str) -> None:
    """Refuse (:class:`ReleaseError`) a name or path that holds bytes that are not UTF-8
    (:mod:`dplang.utf8`): no ledger, JSON file or terminal can hold it."""
    refusal = utf8_refusal(what, text)
    if refusal is not None:
        raise ReleaseError(refusal)


def dataset_key(name: str) -> str:
    """The ledger key of a dataset named by the user (``--dataset NAME``, ``dplang ledger
    budget NAME``, ``[data].dataset``): the name as written (surrounding spaces removed),
    always. A name is never re-keyed to a path, not even when a file of that name exists: that
    would charge the same records to another key (a fresh budget) depending on what the
    current folder holds. (A data file used *without* ``--dataset`` is keyed by its resolved
    path: :func:`dataset_name`; ``dplang ledger budget --data FILE`` budgets that key.)

    The one naming rule of dplang: every command that charges or budgets a dataset goes
    through it. (Privacy contract: none needed; the name is a public input of the data holder,
    kept in the ledger and the private side file only.)"""
    key = name.strip()
    if not key:
        raise ReleaseError("--dataset must not be empty")
    require_utf8("--dataset", key)
    return key


def dataset_name(data: str | Path, given: str | None = None) -> str:
    """The ledger key of a release's dataset: :func:`dataset_key` of the name the user gave
    (``--dataset``), else the input's resolved path."""
    if given is not None:
        return dataset_key(given)
    return str(Path(data).resolve())


def ledger_name(location: str | Path | None) -> str:
    """A ledger as side files record it: a file by its resolved path (the same file from any
    folder), a URL with its password masked. Creates nothing."""
    backend = backend_for(location)
    if backend.path is not None:
        return str(backend.path.expanduser().resolve())
    return backend.location


#: How :meth:`Release.note_failure` starts its note on an exception.
CHARGED_NOTE_PREFIX = "after the charge: "


def make_stream_seed(seed: int, release_id: str | None, coupling: str | None = None) -> int:
    """The root of a release's random streams: H(seed, release id) as a 256-bit integer.

    Every release draws fresh noise whatever seed it is given: two releases with one seed but
    anything else different (parameters, statements, data) have different release ids, hence
    independent streams, so differencing their outputs cancels nothing. (The root is a hash of
    the seed: secret like it; workers only ever receive per-unit stream states.)

    ``coupling`` (audits only: :attr:`Release.coupling`) replaces the release id: runs on
    neighbouring datasets that share the seed and the coupling key draw the same noise, which
    a coupled privacy audit needs and a release must never have (such runs are toy runs)."""
    key = f"coupled:{coupling}" if coupling is not None else f"release:{release_id}"
    blob = json.dumps({"purpose": "dplang random streams", "seed": str(int(seed)), "key": key},
                      sort_keys=True)
    return int.from_bytes(hashlib.sha256(blob.encode("utf-8")).digest(), "big")


def make_seed_tag(dataset: str, seed: int) -> str:
    """H(dataset, seed): what the ledger keeps of a release's seed to refuse its reuse for
    another release of the same dataset (a hash of the seed: private, like the ledger)."""
    blob = json.dumps({"purpose": "dplang seed tag", "dataset": dataset, "seed": str(int(seed))},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def make_release_id(command: str, fingerprint: Mapping[str, Any], dataset: str,
                    data_digest: str, seed: int) -> str:
    """H(command, public fingerprint, dataset name, content digest, seed): the same inputs
    give the same output, hence the same release; any change, a new seed included, is a new
    release. (It is a hash of the seed: keep it private, like the seed.)"""
    blob = json.dumps({"command": command, "fingerprint": fingerprint, "dataset": dataset,
                       "data_sha256": data_digest, "seed": str(int(seed))},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Charge:
    """The outcome of :meth:`Release.charge`: ``recorded`` is False when the same release was
    already in the ledger (a resumed run); ``warnings`` are for the data holder's terminal
    only (they compare private digests)."""

    release_id: str
    #: The ledger as :attr:`PrivacyLedger.location` names it (a file path, or a PostgreSQL URL
    #: with its password masked).
    ledger: str
    recorded: bool
    warnings: tuple[str, ...] = ()


@dataclass
class Release:
    """One release of private data through the pipeline (see the module docstring).

    ``fingerprint`` must hold everything public that determines the output (parameters,
    model, prompt...), and nothing computed from the private rows: it goes into the public
    manifest verbatim."""

    command: str
    guarantee: Guarantee
    fingerprint: dict[str, Any]
    data: Path
    dataset: str
    data_digest: str = field(repr=False)  # private: identifies the data
    seed: int = field(repr=False)  # secret
    seed_source: str
    #: The ledger: a file, a PostgreSQL URL (str), or None for ``$DPLANG_LEDGER`` or the
    #: user data directory's.
    ledger_path: str | Path | None = field(default=None, repr=False)  # may hold a password
    description: str = ""
    #: Wall-clock time when the release was opened, before its computation on the private
    #: rows: the public manifest's ``created`` (see :data:`TIMESTAMP_FIELDS`).
    opened: float = field(default_factory=time.time)
    #: Audits only: a key that replaces the release id in :attr:`stream_seed`, so that runs on
    #: neighbouring datasets sharing the seed and the key draw the same noise (a coupled
    #: audit). Only for toy runs (``guarantee.public_seed``): refused otherwise.
    coupling: str | None = None
    #: The file ``data`` was copied from, when it is a copy (an experiment's references): the
    #: file whose own budget :meth:`charge` checks is not seen (:meth:`_budget_elsewhere`).
    data_source: Path | None = None
    #: SHA-256 of :attr:`data_source` (private): the content the ledger records and compares
    #: (:attr:`content_digest`), so that a sweep's cells and a ``generate`` of the same file
    #: are one content to it. The release id keeps :attr:`data_digest`, the copy's.
    data_source_digest: str | None = field(default=None, repr=False)
    _charge: Charge | None = field(default=None, repr=False)

    @classmethod
    def open(cls, command: str, *, data: str | Path, guarantee: Guarantee,
             fingerprint: Mapping[str, Any], dataset: str | None = None,
             seed: int | None = None, ledger: str | Path | None = None,
             description: str = "", data_digest: str | None = None,
             seed_source: str | None = None, coupling: str | None = None,
             data_source: str | Path | None = None,
             data_source_digest: str | None = None) -> Release:
        """Fix a release: ``dataset`` defaults to the resolved data path, ``seed`` to fresh OS
        entropy; ``data_digest`` (SHA-256 of the data file) is computed when not given.
        ``coupling`` (audits): see :attr:`coupling`."""
        data = Path(data)
        if seed is not None and seed < 0:
            raise ReleaseError(f"--seed must be >= 0, got {seed}")
        # what the ledger and the side files record must be text (a symbolic link into, or a
        # $DPLANG_LEDGER under, a folder whose name is not UTF-8 stopped a run after its charge)
        for what, text in (("the data path", str(data.resolve())),
                           ("the data's source", "" if data_source is None
                            else str(Path(data_source).resolve())),
                           ("the ledger", ledger_name(ledger)),
                           ("the release's description (its output path)", description)):
            require_utf8(what, text)
        if coupling is not None and not guarantee.public_seed:
            raise ReleaseError("coupled random streams are for audits (toy runs) only: a "
                               "release's noise is never shared with another release")
        source = seed_source or ("given" if seed is not None else "fresh OS entropy")
        return cls(command, guarantee, dict(fingerprint), data, dataset_name(data, dataset),
                   data_digest if data_digest is not None else file_digest(data),
                   fresh_seed() if seed is None else int(seed), source,
                   None if ledger is None else ledger_location(ledger), description,
                   coupling=coupling,
                   data_source=None if data_source is None else Path(data_source),
                   data_source_digest=(
                       data_source_digest if data_source_digest is not None
                       else file_digest(data_source) if data_source is not None
                       and Path(data_source).is_file() else None))

    @property
    def release_id(self) -> str:
        return make_release_id(self.command, self.fingerprint, self.dataset, self.data_digest,
                               self.seed)

    @property
    def content_digest(self) -> str:
        """The data content the ledger records and compares with a name's other releases:
        the original file's (:attr:`data_source_digest`) when ``data`` is a copy of some of its
        rows, else the data's own. Private."""
        return self.data_source_digest or self.data_digest

    @property
    def stream_seed(self) -> int:
        """The root of every random stream of this release: H(seed, release id)
        (:func:`make_stream_seed`). Commands draw all their noise from
        ``RandomStreams(release.stream_seed)``, never from the seed itself. Secret."""
        return make_stream_seed(self.seed, self.release_id, self.coupling)

    @property
    def seed_tag(self) -> str | None:
        """What the ledger keeps of the seed to refuse its reuse for another release of the
        dataset (:func:`make_seed_tag`); None for a toy run (its seed is public: it voids the
        guarantee whether reused or not)."""
        return None if self.guarantee.public_seed else make_seed_tag(self.dataset, self.seed)

    @property
    def charged(self) -> Charge | None:
        return self._charge

    def charge(self, on_warning: Callable[[str], None] | None = None) -> Charge:
        """Record the release in the ledger (idempotent per release id). Must come before any
        output. Raises :class:`BudgetExceeded` (nothing recorded, nothing written) when the
        dataset's budget would be exceeded or a release that is not DP (data-dependent, toy)
        meets a budget, and its subclass :class:`SeedReused` when the seed was already used
        for another release of the dataset.

        Privacy contract: the charge is the release's guarantee, fixed ex ante; the ledger is
        private to the data holder (it stores the content digest to warn when a name's content
        changes); ``on_warning`` receives those warnings, which must not go to a public file."""
        ledger = PrivacyLedger(self.ledger_path)
        warnings = tuple(ledger.content_warnings(self.dataset, self.content_digest)
                         + self._budget_elsewhere(ledger)
                         + ([] if ledger.has_release(self.release_id) else
                            ledger.adjacency_warnings(self.dataset, self.guarantee)))
        for w in warnings:
            if on_warning is not None:
                on_warning(w)
        description = self.description or f"dplang {self.command}"
        recorded = ledger.charge(self.dataset, self.release_id, self.guarantee, description,
                                 data_digest=self.content_digest, seed_tag=self.seed_tag)
        self._charge = Charge(self.release_id, ledger.location, recorded, warnings)
        return self._charge

    def stop_note(self, outputs: Sequence[str | Path]) -> str:
        """What a stop (a Ctrl-C, an error) of a release that writes its files at once left,
        in words for the data holder's terminal: charged or not, which of its public
        ``outputs`` were written (after the charge an ``--overwrite``'s earlier files are gone,
        so those that exist are this release's), and what a rerun costs. A stop inside the
        charge asks the ledger (without creating one), which cannot tell this run's record
        from an earlier run's of the same release: either way it is charged once."""
        charge = self._charge
        if charge is None:
            if not self.in_ledger():
                return "nothing was charged or written"
            g = self.guarantee
            cost = (f"the release is in the ledger of dataset {self.dataset!r} (ε="
                    f"{g.epsilon:.4g}, δ={g.delta:g}; charged once, by this run or an "
                    "earlier run of the same release)")
        elif charge.recorded:
            g = self.guarantee
            cost = (f"the release was charged to dataset {self.dataset!r} (ε={g.epsilon:.4g}, "
                    f"δ={g.delta:g})")
        else:
            cost = (f"nothing new was charged to dataset {self.dataset!r} (the release was "
                    "already in the ledger)")
        # before the charge returned, what exists is an earlier release's (--overwrite)
        written = [str(p) for p in outputs if charge is not None and Path(p).exists()]
        wrote = (f"it wrote {', '.join(written)} but not all its files" if written else
                 "nothing was written")
        rerun = ("the same command with the same --seed is the same release, charged once"
                 if self.seed_source == "given" else
                 "its seed is not kept, so a rerun is a new release, charged again")
        return f"{cost}; {wrote}; {rerun}"

    def in_ledger(self) -> bool:
        """Whether the ledger holds this release; False when it cannot answer, or does not
        exist (it is not created to ask)."""
        try:
            backend = backend_for(self.ledger_path)
            if backend.path is not None and not backend.path.exists():
                return False
            return PrivacyLedger(self.ledger_path).has_release(self.release_id)
        except Exception:  # the ledger cannot answer now: say what is known
            return False

    @contextlib.contextmanager
    def stops_reported(self, outputs: Sequence[str | Path]) -> Iterator[None]:
        """Around a release's charge and writes: a Ctrl-C is re-raised with :meth:`stop_note`
        as its message, and another failure gets it as a note (:meth:`note_failure`)."""
        try:
            yield
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"interrupted: {self.stop_note(outputs)}") from None
        except Exception as exc:
            self.note_failure(exc, outputs)
            raise

    def note_failure(self, exc: BaseException, outputs: Sequence[str | Path]) -> None:
        """Attach :meth:`stop_note` to ``exc``, a failure after this run's charge returned (a
        full disk, a bug), so that its message says what was charged and written
        (:func:`dplang.api.errors.one_line` shows the note). A failure inside the charge (a
        locked or unreachable ledger) recorded nothing: no note."""
        if self._charge is not None:
            exc.add_note(CHARGED_NOTE_PREFIX + self.stop_note(outputs))

    def _budget_elsewhere(self, ledger: PrivacyLedger) -> list[str]:
        """A warning when the data file itself has a budget in the ledger (keyed by its
        resolved path) but this release is charged to another dataset name: that budget does
        not see this charge."""
        data = self.data_source or self.data
        path_key = dataset_name(data)
        if path_key == self.dataset:
            return []
        budget = ledger.budget(path_key)
        if budget is None:
            return []
        return [f"the data file {data} has its own budget in the ledger (ε = "
                f"{budget[0]:g}, δ = {budget[1]:g}), but this release is charged to dataset "
                f"{self.dataset!r}, not to it: that budget does not see this charge (pass "
                "--dataset with the name that holds the budget)"]

    def _require_charge(self) -> Charge:
        if self._charge is None:
            raise RuntimeError("charge the ledger (Release.charge) before writing any output "
                               "(docs/privacy.md invariant 6)")
        return self._charge

    def public_manifest(self, **fields: Any) -> dict[str, Any]:
        """The public manifest: format, command, version, guarantee (and plain-words summary),
        ρ/ε/δ, ``ex_ante``, the public fingerprint, a ``created`` timestamp (when the release
        was opened: before the private computation, so it reveals no duration), then
        ``fields`` (which must hold no end time or duration either).

        Privacy contract: a function of public inputs only, provided ``fields`` and the
        fingerprint are (the caller's duty; the neighbouring-dataset tests check it)."""
        g = self.guarantee
        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "command": self.command,
            "dplang_version": __version__,
            "guarantee": g.to_dict(),
            "guarantee_summary": g.summary(),
            "rho": g.rho,
            "epsilon": g.epsilon,
            "delta": g.delta,
            "ex_ante": g.ex_ante,
            "fingerprint": self.fingerprint,
            "private_side_file": f"kept in {PRIVATE_DIR}/ beside the output (folder mode "
                                 "700, file mode 600); not part of the release (data digest, "
                                 "counts, paths; the seed only where a run must resume)",
            "created": self.opened,  # before the private computation: no timing side channel
        }
        if g.public_seed:
            manifest["toy_run"] = ("the seed of this release is public (written in a "
                                   "configuration file): it has NO privacy guarantee")
        manifest.update(fields)
        return manifest

    def private_record(self, *, keep_seed: bool, **fields: Any) -> dict[str, Any]:
        """The private side file's content: release id, dataset name, data path and digest,
        ledger path, the seed (only when ``keep_seed``: needed to resume), then ``fields``
        (counts and other statistics of the private data)."""
        charge = self._require_charge()
        record: dict[str, Any] = {
            "format": PRIVATE_FORMAT,
            "note": PRIVATE_NOTE,
            "command": self.command,
            "release_id": self.release_id,
            "dataset": self.dataset,
            "data": {"path": str(self.data), "sha256": self.data_digest},
            "ledger": charge.ledger,
            "seed": self.seed if keep_seed else None,
            "seed_source": self.seed_source + ("" if keep_seed else "; not stored"),
            "created": time.time(),
        }
        for key, value in fields.items():
            if key == "data" and isinstance(value, Mapping):
                record["data"].update(value)
            else:
                record[key] = value
        return record

    def opening_record(self, **fields: Any) -> dict[str, Any]:
        """The private side file of a resumable run *before* its charge: release id, dataset
        name, data path and digest, the seed, the public fingerprint, ``"stage": "opened"``
        (:data:`OPENED_STAGE`), then ``fields``. Written by :meth:`write_opening` so that a
        stop inside the charge, or between it and the run's first public file, keeps the
        seed of a release the ledger may hold: the same command continues it, charged once
        (``dplang.textgen.resume``)."""
        record: dict[str, Any] = {
            "format": PRIVATE_FORMAT,
            "note": PRIVATE_NOTE,
            "command": self.command,
            "stage": OPENED_STAGE,
            "release_id": self.release_id,
            "dataset": self.dataset,
            "data": {"path": str(self.data), "sha256": self.data_digest},
            "seed": self.seed,
            "seed_source": self.seed_source,
            "fingerprint": self.fingerprint,
            # the ledger it is charged to (a file by its resolved path, a URL with its
            # password masked): only that ledger can say whether the release was charged
            "ledger": ledger_name(self.ledger_path),
            "created": time.time(),
        }
        record.update(fields)
        return record

    def write_opening(self, paths: OutputPaths, record: Mapping[str, Any], *,
                      replacing: bool = False) -> None:
        """Write :meth:`opening_record`'s record to ``paths.private`` (mode 600 in the mode-700
        private folder), or with ``replacing`` to ``paths.replacement`` (an ``--overwrite``
        whose earlier run's files stay until the charge), before the charge: the one private
        write allowed then. Nothing public is written before the charge (invariant 6)."""
        if record.get("stage") != OPENED_STAGE:
            raise ValueError("write_opening takes an opening_record()")
        write_json(paths.replacement if replacing else paths.private, record, private=True)

    def write_private(self, paths: OutputPaths, record: Mapping[str, Any]) -> None:
        """Write the private side file ``paths.private`` atomically with mode 600 from
        creation, in its private folder (mode 700); a side file an older dplang left under a
        legacy name (beside the output: visible to ``stat``) is removed."""
        self._require_charge()
        write_json(paths.private, record, private=True)
        for legacy in paths.legacy_privates:
            legacy.unlink(missing_ok=True)

    def write_manifest(self, paths: OutputPaths, manifest: Mapping[str, Any]) -> None:
        """Write the public manifest ``paths.manifest`` atomically (after the charge), its
        modification time set to :attr:`opened` (however late it is written); a manifest an
        older dplang wrote under a legacy name is removed."""
        self._require_charge()
        write_json(paths.manifest, manifest, times=self.opened)
        for legacy in paths.legacy_manifests:
            legacy.unlink(missing_ok=True)

    def write_output(self, path: str | Path, data: str | bytes) -> None:
        """Write released content atomically (after the charge), its modification time set
        to :attr:`opened`: the file's times do not show how long the computation took."""
        self._require_charge()
        write_atomic(path, data, times=self.opened)

    def publish(self, paths: OutputPaths, data: str | bytes) -> None:
        """Publish a resumable output that grew in ``paths.partial`` (:func:`publish`, with
        the times of :attr:`opened`)."""
        self._require_charge()
        publish(paths.partial, paths.output, data, times=self.opened)

    def append_log(self, paths: OutputPaths) -> AppendLog:
        """Open a resumable line-by-line output (after the charge) in ``paths.partial``
        (mode 600 in the private folder): it is made public by :meth:`publish` once complete.
        A run an older dplang left growing at ``paths.output`` moves there first."""
        self._require_charge()
        private_dir(paths.partial.parent)
        if paths.output.exists() and not paths.partial.exists():
            os.replace(paths.output, paths.partial)
            os.chmod(paths.partial, PRIVATE_MODE)
            fsync_dir(paths.partial.parent)
            fsync_dir(paths.output.parent)
        return AppendLog(paths.partial, private=True)
