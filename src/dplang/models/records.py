"""Records of load-time decisions kept in dplang's cache folder, and the keys they are kept
under: what decides the arithmetic's bits on this machine (the CPU, the libraries, the
environment variables that steer kernels, the arithmetic's own source).

A decision on record (a passed row-invariance check, a verification of the exact decoder
against the model's own forward, an admission probe of a kernel) is taken again, without
running it, only under the same key; ``DPLANG_RECHECK_INVARIANCE=1`` runs every check again.
A leaf module (it imports no other module of the arithmetic), so that the kernels' admission
can keep records without an import cycle.

Privacy: records hold public facts about code and machine (no data); a wrong reuse would be a
check skipped, which is why every key holds everything the decision depends on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "RECHECK_ENV",
    "arithmetic_modules",
    "arithmetic_source_digest",
    "cpu_identity",
    "file_stamps",
    "import_statements",
    "kernel_environment",
    "package_versions",
    "read_json",
    "recheck_requested",
    "record_folder",
    "record_verification",
    "verified_on_record",
    "write_json",
]

#: Set to 1 to run the check at every load even when an earlier pass is on record.
RECHECK_ENV = "DPLANG_RECHECK_INVARIANCE"
#: Where the derivation of the arithmetic's modules starts: the backend and this check.
_ARITHMETIC_ROOTS = ("dplang.models.transformers", "dplang.models.invariance")
#: Environment variables that choose kernels, vector paths or thread counts of the libraries
#: the arithmetic runs on (their values are part of the record's key).
_KERNEL_ENV_PREFIXES = ("ATEN_", "ONEDNN_", "DNNL_", "MKL_", "NUMBA_", "TRITON_", "CUBLAS",
                        "TORCH_", "PYTORCH_")
_KERNEL_ENV_NAMES = ("DPLANG_NO_KERNELS", "DPLANG_NO_PACKED_INT8", "DPLANG_THREADS")
#: Packages whose code computes the bits (their installed versions are part of the key).
_ARITHMETIC_PACKAGES = ("torch", "numpy", "numba", "llvmlite", "triton", "transformers")


def recheck_requested() -> bool:
    """Whether ``DPLANG_RECHECK_INVARIANCE`` asks every check on record to run again."""
    return os.environ.get(RECHECK_ENV, "") not in ("", "0")


def read_json(path: Path) -> dict[str, Any]:
    """A record's contents, or ``{}`` where it is missing, not a regular file (a folder, a
    FIFO that would block the read), unreadable or not a JSON object, nested too deeply to
    parse included (a record that is not ours counts as none)."""
    try:
        if not path.is_file():
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def file_stamps(paths: list[Path]) -> list[list[Any]]:
    """``[resolved path, size, modification time]`` of each of ``paths`` that exists: part of
    a key that changes whenever one of the files does, without reading them."""
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return stamps


def write_json(folder: Path, path: Path, data: dict[str, Any]) -> None:
    """Write a record atomically (a temporary file renamed over ``path``) in ``folder``, a
    folder only its owner may enter (:func:`dplang.release.private_dir`): a record's times are
    those of the load that wrote it, after the run had read its data, so nobody else may
    ``stat`` them. A cache that cannot be written, or whose folder is not this user's own,
    keeps no record (the check runs again next time) and no temporary file."""
    from dplang.release import ReleaseError, private_dir

    temporary = None
    try:
        private_dir(folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as fh:
            temporary = fh.name
            json.dump(data, fh)
        os.replace(temporary, path)
    except (OSError, ReleaseError):  # a read-only cache, a full disk, another's folder
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def record_folder() -> Path:
    from dplang.models.cache import cache_dir

    return cache_dir() / "invariance"


def arithmetic_modules(root: Path | None = None) -> list[Path]:
    """The source files of every module of dplang's model arithmetic: the modules of
    ``dplang.models`` that the backend and this check import, directly or through each other,
    at module level or inside functions (found by reading their import statements, so a new
    kernel module joins the list by being imported, never by being listed by hand).

    ``root`` is the folder of the ``dplang`` package (default: this one)."""
    import ast

    root = root or Path(__file__).resolve().parent.parent
    found: dict[str, Path] = {}
    todo = list(_ARITHMETIC_ROOTS)
    while todo:
        name = todo.pop()
        if name in found or not name.startswith("dplang.models"):
            continue
        parts = name.split(".")[1:]
        path = root.joinpath(*parts).with_suffix(".py")
        package = root.joinpath(*parts) / "__init__.py"
        if package.is_file():
            path = package
        if not path.is_file():
            continue
        found[name] = path
        base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in import_statements(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base.split(".")[: len(base.split(".")) - node.level + 1]
                    module = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                todo.append(module)
                todo += [f"{module}.{alias.name}" for alias in node.names]
    return [found[name] for name in sorted(found)]


#: The fields of a node that hold statements (an import is a statement, never an expression).
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def import_statements(tree: Any) -> list[Any]:
    """Every ``import`` and ``from ... import`` statement of a module's syntax tree, at any
    depth (in functions, classes, branches, ``try``, ``with``, ``match``), found by walking
    statement lists only: ``ast.walk`` visits every expression too, five times the nodes
    (0.3 s of every load for the arithmetic's modules)."""
    import ast

    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        for field in _STATEMENT_FIELDS:
            todo.extend(getattr(node, field, None) or ())
    return found


#: Digests already computed in this process, by the files' (path, size, modification time):
#: a load computes the key several times, and parsing and hashing every module took ~50 ms.
_DIGESTS: dict[tuple[Any, ...], str] = {}
_MODULES: dict[Path, list[Path]] = {}


def arithmetic_source_digest(root: Path | None = None) -> str:
    """sha256 over the sources of :func:`arithmetic_modules` (with their paths); computed
    again whenever a file's size or modification time changed."""
    root = root or Path(__file__).resolve().parent.parent
    if root not in _MODULES:
        _MODULES[root] = arithmetic_modules(root)
    paths = _MODULES[root]
    stats = [path.stat() for path in paths]
    stamp = (root, *((str(p), st.st_size, st.st_mtime_ns) for p, st in zip(paths, stats,
                                                                           strict=True)))
    if stamp not in _DIGESTS:
        digest = hashlib.sha256()
        for path in paths:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes()
                          + b"\0")
        _DIGESTS[stamp] = digest.hexdigest()
    return _DIGESTS[stamp]


_VERSIONS: dict[str, str] = {}


def package_versions() -> dict[str, str]:
    """The installed versions of the arithmetic's packages (read once per process: scanning
    the installed distributions costs tens of milliseconds each time)."""
    if _VERSIONS:
        return dict(_VERSIONS)
    from importlib import metadata

    versions = {}
    for name in _ARITHMETIC_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["torch_runtime"] = torch.__version__
    _VERSIONS.update(versions)
    return versions


#: Words of environment variable names that locate files or logs: not kernel choices
#: (``NUMBA_CACHE_DIR`` is set by dplang itself when numba loads).
_NOT_KERNEL_WORDS = ("CACHE", "DIR", "HOME", "PATH", "LOG", "DEBUG", "VERBOSE")


def kernel_environment() -> dict[str, str]:
    """The environment variables that may steer the libraries' kernels (prefixes
    :data:`_KERNEL_ENV_PREFIXES`), without those that only locate files or logs."""
    return {k: v for k, v in sorted(os.environ.items())
            if (k.startswith(_KERNEL_ENV_PREFIXES) or k in _KERNEL_ENV_NAMES)
            and not any(word in k for word in _NOT_KERNEL_WORDS)}


def cpu_identity() -> str:
    """The CPU as the kernels see it: vendor, family, model and model name, ISA flags, cache
    size, microcode and topology (cores, siblings) from ``/proc/cpuinfo`` (a library's
    blocking and kernel choice follow them)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in text.splitlines()
            if line.startswith(("model name", "flags", "vendor_id", "cpu family", "model\t",
                                "cache size", "microcode", "cpu cores", "siblings"))]
    return "\n".join(sorted(set(keep)))


def verified_on_record(key: str) -> bool:
    """Whether verification ``key`` passed before (``DPLANG_RECHECK_INVARIANCE=1``: never)."""
    if recheck_requested():
        return False
    return read_json(record_folder() / f"{key}.json").get("verified") is True


def record_verification(key: str) -> None:
    folder = record_folder()
    write_json(folder, folder / f"{key}.json", {"verified": True})
