"""The registry of the formal lab's algorithms: one :class:`FormalAlgorithm` per algorithm, by
name, registered beside its class (000's in :mod:`dplang.formal.statistical`, 001's in
:mod:`dplang.formal.limit`).

``dplang formal`` knows the algorithms only through this registry (as generation knows its
methods, :mod:`dplang.textgen.methods.registry`): their names and paper numbers, which setting
each runs in, whether it is private, which of them add Gaussian noise (and take δ and a
calibration), the utility theorem each is checked against. A leaf: it imports no algorithm; the
modules that register the built-in ones are imported on first use.

Privacy contract: none of its own; each algorithm's class states its guarantee.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

__all__ = [
    "SETTINGS",
    "FormalAlgorithm",
    "algorithm_names",
    "algorithms_in",
    "get_algorithm",
    "register_algorithm",
    "resolve_algorithm",
]

#: The settings: ``statistical`` (a sample of n, ``--n``) and ``limit`` (a stream, ``--horizon``).
SETTINGS = ("statistical", "limit")

#: Modules that register the built-in algorithms when first imported (in ``formal list`` order).
BUILTIN_MODULES = ("dplang.formal.statistical", "dplang.formal.limit")


@dataclass(frozen=True)
class FormalAlgorithm:
    """One algorithm of the lab.

    ``paper`` is its number in the papers (``000·3``; ``--`` form ``000.3`` is an alias, as is
    each of ``aliases``); ``task`` is ``identification`` or ``generation``; ``settings`` those
    of :data:`SETTINGS` it runs in; ``private``: False for the non-private baselines (no ε);
    ``gaussian``: it adds Gaussian noise, an (ε, δ) guarantee with a calibration;
    ``theorem``: the utility guarantee whose conditions ``dplang formal run`` checks."""

    name: str
    cls: type
    paper: str
    task: str
    settings: tuple[str, ...]
    private: bool = True
    gaussian: bool = False
    theorem: str = ""
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.task not in ("identification", "generation"):
            raise ValueError(f"{self.name}: task must be identification or generation")
        if not self.settings or set(self.settings) - set(SETTINGS):
            raise ValueError(f"{self.name}: settings must be among {SETTINGS}")

    @property
    def names(self) -> tuple[str, ...]:
        """Its name, its paper number in ``--`` form (``000·3`` → ``000.3``) and its aliases,
        lower case."""
        numbered = [_key(self.paper)] if re.fullmatch(r"\d{3}·\S+", self.paper) else []
        return (self.name, *numbered, *(_key(a) for a in self.aliases))


def _key(name: str) -> str:
    return name.strip().lower().replace("·", ".")


_ALGORITHMS: dict[str, FormalAlgorithm] = {}
_BUILTINS_LOADED: list[bool] = []


def register_algorithm(entry: FormalAlgorithm, *, replace: bool = False) -> FormalAlgorithm:
    """Add ``entry`` under its name; a name or alias already taken is refused unless
    ``replace`` (tests). Returns the entry."""
    if entry.name in _ALGORITHMS and not replace:
        raise ValueError(f"an algorithm named {entry.name!r} is already registered")
    taken = {key for other in _ALGORITHMS.values() if other.name != entry.name
             for key in other.names}
    clash = [key for key in entry.names if key in taken]
    if clash:
        raise ValueError(f"{entry.name}: the name {clash[0]!r} is already taken")
    _ALGORITHMS[entry.name] = entry
    return entry


def _load_builtins() -> None:
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED.append(True)
        for module in BUILTIN_MODULES:
            importlib.import_module(module)


def algorithm_names() -> tuple[str, ...]:
    """Every registered algorithm, in registration order (000's, then 001's)."""
    _load_builtins()
    return tuple(_ALGORITHMS)


def algorithms_in(*settings: str) -> tuple[str, ...]:
    """The algorithms that run in exactly ``settings`` (``algorithms_in("statistical")``: those
    of the statistical setting only)."""
    _load_builtins()
    return tuple(name for name, entry in _ALGORITHMS.items()
                 if set(entry.settings) == set(settings))


def resolve_algorithm(name: str) -> str | None:
    """The registered name of ``name`` (a name, a paper number such as ``000.3`` or ``000·3``,
    or an alias; any case), else ``None``."""
    _load_builtins()
    key = _key(name)
    for entry in _ALGORITHMS.values():
        if key in entry.names:
            return entry.name
    return None


def get_algorithm(name: str) -> FormalAlgorithm:
    """The entry of ``name`` (see :func:`resolve_algorithm`); ``KeyError`` if none."""
    resolved = resolve_algorithm(name)
    if resolved is None:
        raise KeyError(name)
    return _ALGORITHMS[resolved]
