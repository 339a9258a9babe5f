"""The registry of private generation methods: one :class:`MethodSpec` per method, by name.

Orchestration (:mod:`dplang.textgen.orchestration`), the ``generate`` command and the
experiment sweeps know methods only through this registry (after Opacus's accountant
registry): adding a method is one new module that calls :func:`register_method` and one line
in :data:`BUILTIN_MODULES`. A spec says

* which adjacencies its guarantee holds for and which budget forms it accepts (``--epsilon``,
  ``--rho``, ``--clip``);
* its own options (``--<method>-<option>`` on the command line, ``method_options`` in a
  :class:`~dplang.textgen.orchestration.GenerationRequest`), typed, defaulted and checked;
* how to calibrate: ``calibrate(inputs, options)`` returns a frozen params object that knows
  its :class:`~dplang.privacy.guarantees.Guarantee` (built next to the mechanism, as
  dp_accounting's events describe themselves) and makes the engine's per-group step policies;
  a population method (Aug-PE) returns params whose ``run_population`` produces every text at
  once instead.

Privacy contract of the registry: none of its own; each spec's params carry the contract of
their method, and orchestration releases exactly ``params.guarantee()``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...privacy.guarantees import Adjacency, Guarantee
from ..engine import GroupResult

#: Modules that register the built-in methods when first imported (in CLI order).
BUILTIN_MODULES = (
    "dplang.textgen.methods.invisibleink",
    "dplang.textgen.methods.amin",
    "dplang.textgen.methods.adapmixed",
    "dplang.textgen.methods.augpe",
    "dplang.textgen.methods.nonprivate",
)

#: The budget forms a request can give; a spec lists those it accepts.
BUDGET_FORMS = ("epsilon", "rho", "clip")


@dataclass(frozen=True)
class MethodInputs:
    """The public parameters every method sees (the shared part of a generation request)."""

    epsilon: float | None
    delta: float
    rho: float | None
    clip: float | None
    batch_size: int
    max_tokens: int
    temperature: float
    top_k: int
    adjacency: Adjacency


@dataclass(frozen=True)
class MethodOption:
    """One option of a method: ``--<method>-<name>`` on the command line (``_`` → ``-``).

    ``check(value)`` returns an error message, or None when the value is acceptable.
    ``in_sweeps``: an experiment config may set it (``[generation].<method>_<name>``) and each
    cell of the method records its value; in sweeps the other options keep their defaults."""

    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] = ()
    in_sweeps: bool = False

    def flag(self, method: str) -> str:
        return f"--{method}-{self.name}".replace("_", "-")

    def parse(self, method: str, value: Any) -> Any:
        """``value`` converted to the option's type and checked; ``ValueError`` otherwise."""
        flag = self.flag(method)
        try:
            if self.type is bool and not isinstance(value, bool):
                raise TypeError
            if self.type is int and (isinstance(value, bool) or int(value) != value):
                raise TypeError
            converted = self.type(value)
        except (TypeError, ValueError):
            raise ValueError(f"{flag} must be {self.type.__name__}, got {value!r}") from None
        if self.choices and converted not in self.choices:
            raise ValueError(f"{flag} must be one of {', '.join(self.choices)}, got "
                             f"{converted!r}")
        problem = self.check(converted) if self.check is not None else None
        if problem:
            raise ValueError(f"{flag} {problem}, got {converted!r}")
        return converted


def positive(value: float) -> str | None:
    """An option check: finite and > 0."""
    return None if math.isfinite(value) and value > 0 else "must be finite and > 0"


def finite(value: float) -> str | None:
    return None if math.isfinite(value) else "must be finite"


def at_least(bound: int) -> Callable[[int], str | None]:
    return lambda value: None if value >= bound else f"must be >= {bound}"


class MethodParams(Protocol):
    """A calibrated method: frozen, public, and the only source of its guarantee."""

    @property
    def clip(self) -> float:
        """The clip norm the manifest records (0 when the method has none)."""
        ...

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """What every release of this method, with these parameters, satisfies (the one
        signature of :class:`~dplang.privacy.guarantees.GuaranteeSource`; a method's guarantee
        does not depend on the number of references)."""
        ...


#: What a population method's runner is given besides its params: the model, every
#: reference of the planned batches in order, the number of texts, the public prompt, the
#: system prompt, the secret seed and a progress callback; it returns one GroupResult per text
#: and statistics for the manifest.
PopulationRunner = Callable[..., tuple[list[GroupResult], dict[str, Any]]]


@dataclass(frozen=True)
class MethodSpec:
    """Everything orchestration needs to know about one generation method."""

    name: str
    summary: str
    adjacencies: tuple[Adjacency, ...]
    calibrate: Callable[[MethodInputs, Mapping[str, Any]], MethodParams]
    options: tuple[MethodOption, ...] = ()
    #: The budget forms it accepts; none for a method that is not private (``takes_budget``).
    budget_forms: tuple[str, ...] = ("epsilon",)
    #: Set for a population method (all texts from one run over all references); the params
    #: then need no step policies.
    run_population: PopulationRunner | None = None
    #: Model calls per generated token, for the sweeps' compute axis (B + 1 for the token
    #: methods; a population method states its own).
    calls_per_token: Callable[[int, Mapping[str, Any]], int] = field(
        default=lambda batch_size, _options: batch_size + 1)
    #: Loads what the method needs besides the language model (Aug-PE's sentence embedder)
    #: before the ledger is charged, so that the charge is the last step before the first
    #: computation on the private references: a failure or a Ctrl-C while loading costs
    #: nothing. Called with the calibrated params; reads no private data.
    prepare: Callable[[Any], None] | None = None
    #: Keys of a population method's run statistics that are *released DP statistics*:
    #: computed from its noisy releases only (post-processing), covered by its guarantee like
    #: the texts, so they may differ between neighbouring datasets. Every other key of the
    #: statistics written into the public manifest must be a function of public inputs.
    released_statistics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.budget_forms) - set(BUDGET_FORMS)
        if unknown:
            raise ValueError(f"{self.name}: budget forms must be among {BUDGET_FORMS}")
        if not self.adjacencies:
            raise ValueError(f"{self.name}: a method must hold for at least one adjacency")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate option names {names}")

    @property
    def takes_budget(self) -> bool:
        """False for a method that is not private at all (no budget form: the ``nonprivate``
        ceiling): a request gives it no ``--epsilon``, ``--rho`` or ``--clip``, a sweep gives
        it one cell per point at ε = ∞, and its guarantee says that it is not private
        (:meth:`~dplang.privacy.guarantees.Guarantee.non_private`)."""
        return bool(self.budget_forms)

    def resolve_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option of this method, ``given`` ones parsed and checked, defaults for the
        rest. ``ValueError`` (one line) for an option the method does not have."""
        known = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            shown = ", ".join(o.flag(self.name) for o in self.options) or "none"
            raise ValueError(f"--method {self.name} has no option "
                             f"{', '.join(repr(u) for u in unknown)} (its options: {shown})")
        return {name: (opt.parse(self.name, given[name]) if name in given else opt.default)
                for name, opt in known.items()}


_METHODS: dict[str, MethodSpec] = {}
_BUILTINS_LOADED = False


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add ``spec`` under ``spec.name``; a second spec of the same name is refused unless
    ``replace`` (tests). Returns the spec (so a module can keep it as a constant)."""
    if spec.name in _METHODS and not replace:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    if spec.name == "public":
        raise ValueError("'public' is reserved (public-only generation is not a method)")
    _METHODS[spec.name] = spec
    return spec


def unregister_method(name: str) -> None:
    """Remove a method (tests that register a toy one)."""
    _METHODS.pop(name, None)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)


def _ordered() -> list[MethodSpec]:
    """Built-ins in :data:`BUILTIN_MODULES` order (whatever order they were imported in),
    then the others in registration order."""
    _load_builtins()
    builtin = [m.rsplit(".", 1)[1] for m in BUILTIN_MODULES]
    rank = {name: i for i, name in enumerate(builtin)}
    order = {name: i for i, name in enumerate(_METHODS)}
    return sorted(_METHODS.values(),
                  key=lambda spec: (rank.get(spec.name, len(rank)), order[spec.name]))


def method_names() -> tuple[str, ...]:
    """Registered method names, built-ins first in CLI order."""
    return tuple(spec.name for spec in _ordered())


def get_method(name: str) -> MethodSpec:
    """The spec registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    _load_builtins()
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"--method must be one of {', '.join(method_names())}, got "
                         f"{name}") from None


def all_methods() -> Sequence[MethodSpec]:
    """Every registered spec, in :func:`method_names` order."""
    return tuple(_ordered())
