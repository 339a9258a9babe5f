"""What a release promises: the :class:`Guarantee` every private output carries."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from .conversions import rho_to_delta, rho_to_epsilon


class Adjacency(StrEnum):
    """Which data sets are neighbours: the relation a guarantee is stated for (after
    dp_accounting's ``NeighboringRelation``). A :class:`StrEnum`: each member equals, prints and
    serialises as its name in the CLI (``"replace-by-null"``...), so JSON files and flags keep
    their strings while code compares members.

    * ``REPLACE_BY_NULL``: one unit is replaced by the empty unit, kept in place (the default
      for references: the number and positions of units are public);
    * ``REPLACE_ONE``: one unit is replaced by any other;
    * ``ADD_REMOVE``: one unit is added or removed;
    * ``ZERO_OUT``: one unit is replaced by the zero-logit null element (InvisibleInk, Amin et
      al.: twice the replace-by-null sensitivity).
    """

    REPLACE_BY_NULL = "replace-by-null"
    REPLACE_ONE = "replace-one"
    ADD_REMOVE = "add-remove"
    ZERO_OUT = "zero-out"

    @classmethod
    def parse(cls, value: str | Adjacency) -> Adjacency:
        """The member named ``value``; a one-line ``ValueError`` listing the names otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown adjacency {value!r}; expected one of "
                             f"{', '.join(a.value for a in cls)}") from None


#: The names of every :class:`Adjacency`, in declaration order.
ADJACENCIES = tuple(a.value for a in Adjacency)

_ADJACENCY_WORDS = {
    "replace-by-null": "replacing one {unit} by the empty {unit}",
    "replace-one": "replacing one {unit} by any other",
    "add-remove": "adding or removing one {unit}",
    "zero-out": "replacing one {unit} by the zero-logit null element",
}


@dataclass(frozen=True)
class Guarantee:
    """A differential-privacy guarantee attached to a release.

    ``rho`` is the zero-concentrated DP parameter when the mechanism is analysed in zCDP (then
    ``epsilon`` is its tight conversion at ``delta``); for a pure ε-DP release ``rho`` may be
    ``None`` and ``delta`` is 0. ``epsilon = ∞`` (:meth:`non_private`) marks a release that is
    not private at all (a non-private baseline, e.g. the ``nonprivate`` ceiling of experiments):
    its summary says so. ``ex_ante`` is False for data-dependent and non-private guarantees
    (no bound fixed before the data is read); ``details`` holds mechanism
    parameters worth recording (clip norm, batch size, ...). ``public_seed`` is True for a *toy
    run*: a release whose random seed is public (written in a configuration file), so anyone
    can recompute its noise and the release promises nothing; (ρ, ε, δ) are then what the
    mechanism would promise with a secret seed.

    A mechanism states its guarantee with a named constructor — :meth:`zcdp`, :meth:`pure`,
    :meth:`approximate`, or one of the not-DP labels :meth:`data_dependent` and
    :meth:`non_private` (and :meth:`as_toy` for a toy run) — so that the ρ → ε conversion, and
    the check that a target ε really follows from ρ, are written once, here (composition, in
    :mod:`dplang.privacy.accounting`, uses them too, with :func:`dataclasses.replace` for the
    labels). The field-by-field constructor is for deserialisation (:meth:`from_dict`).
    """

    mechanism: str
    unit: str
    adjacency: Adjacency
    rho: float | None
    epsilon: float
    delta: float
    ex_ante: bool = True
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    public_seed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "adjacency", Adjacency.parse(self.adjacency))
        if self.rho is not None and not (self.rho >= 0 and math.isfinite(self.rho)):
            raise ValueError(f"rho must be finite and >= 0, got {self.rho}")
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {self.delta}")

    # -- named constructors: how a mechanism states what it promises ---------------------

    @classmethod
    def zcdp(cls, mechanism: str, unit: str, adjacency: Adjacency | str, rho: float,
             delta: float, *, epsilon: float | None = None,
             details: Mapping[str, Any] | None = None) -> Guarantee:
        """ρ-zCDP, stated with the (ε, δ)-DP it implies: ε is the tight conversion of ρ at δ
        (rounded up; 0 when ρ = 0), or ``epsilon`` when the mechanism was calibrated for that
        target, which is checked: ρ-zCDP must imply (ε, δ)-DP (``ValueError`` otherwise)."""
        if epsilon is None:
            epsilon = 0.0 if rho == 0 else rho_to_epsilon(rho, delta)
        elif not rho_to_delta(rho, epsilon) <= delta:
            raise ValueError(f"{rho:.17g}-zCDP does not imply ({epsilon:.17g}, {delta:g})-DP")
        return cls(mechanism, unit, adjacency, rho, epsilon, delta, details=_details(details))

    @classmethod
    def pure(cls, mechanism: str, unit: str, adjacency: Adjacency | str, epsilon: float, *,
             details: Mapping[str, Any] | None = None) -> Guarantee:
        """Pure ε-DP (δ = 0, no ρ)."""
        return cls(mechanism, unit, adjacency, None, epsilon, 0.0, details=_details(details))

    @classmethod
    def approximate(cls, mechanism: str, unit: str, adjacency: Adjacency | str, epsilon: float,
                    delta: float, *, details: Mapping[str, Any] | None = None) -> Guarantee:
        """(ε, δ)-DP without a zCDP analysis (δ = 0 is pure ε-DP)."""
        return cls(mechanism, unit, adjacency, None, epsilon, delta, details=_details(details))

    @classmethod
    def data_dependent(cls, mechanism: str, unit: str, adjacency: Adjacency | str,
                       epsilon: float, delta: float, *,
                       details: Mapping[str, Any] | None = None) -> Guarantee:
        """NOT differential privacy: a data-dependent accounting that stops at a target
        (ε, δ) computed from the private data (``ex_ante`` False; :meth:`summary` says so)."""
        return cls(mechanism, unit, adjacency, None, epsilon, delta, ex_ante=False,
                   details=_details(details))

    @classmethod
    def unproven(cls, mechanism: str, unit: str, adjacency: Adjacency | str, epsilon: float,
                 delta: float, *, assumption: str,
                 details: Mapping[str, Any] | None = None) -> Guarantee:
        """NOT differential privacy as far as dplang can tell: an accounting (typically a
        paper's own code, kept to reproduce its numbers) that rests on ``assumption``, which
        dplang cannot prove. ``ex_ante`` False, so a ledger records it outside every DP total
        and a dataset with a DP budget refuses it; :meth:`summary` says what is assumed."""
        return cls(mechanism, unit, adjacency, None, epsilon, delta, ex_ante=False,
                   details={**(details or {}), "unproven": assumption})

    @property
    def kind(self) -> str:
        """What the (ε, δ) of this guarantee is, in a few words: ``DP``, ``data-dependent,
        NOT DP``, ``unproven accounting, NOT DP``, ``NOT PRIVATE`` or (a toy run) ``toy run,
        NOT DP``."""
        if self.public_seed:
            return "toy run, NOT DP"
        if math.isinf(self.epsilon):
            return "NOT PRIVATE"
        if self.ex_ante:
            return "DP"
        if self.details.get("unproven"):
            return "unproven accounting, NOT DP"
        return "data-dependent, NOT DP"

    @classmethod
    def non_private(cls, mechanism: str, unit: str, adjacency: Adjacency | str, *,
                    details: Mapping[str, Any] | None = None) -> Guarantee:
        """No privacy at all (a non-private baseline): ε = ∞, marked ``private: False``, and
        not ex ante (:attr:`is_dp` False), so a ledger records it outside every DP total, as
        it records a data-dependent release, and a dataset with a DP budget refuses it."""
        return cls(mechanism, unit, adjacency, None, math.inf, 0.0, ex_ante=False,
                   details={"private": False, **(details or {})})

    @property
    def is_dp(self) -> bool:
        """True when the release satisfies differential privacy as stated: an ex-ante
        guarantee whose seed is secret (not data-dependent, not a toy run)."""
        return self.ex_ante and not self.public_seed

    def as_toy(self) -> Guarantee:
        """This guarantee for a toy run: the same numbers, marked as voided by a public
        seed."""
        return replace(self, public_seed=True)

    @property
    def is_pure(self) -> bool:
        """True for a pure ε-DP guarantee (δ = 0)."""
        return self.delta == 0

    def summary(self) -> str:
        """One paragraph, in plain words, of what this guarantee promises.

        For a data-dependent guarantee (``ex_ante`` False) it says that the release does *not*
        satisfy differential privacy: the printed (ε, δ) is a stopping target for a privacy
        estimate computed from the private data, which bounds nothing for neighbouring data
        sets (their estimate, hence their stopping point, differs)."""
        neighbours = _ADJACENCY_WORDS[self.adjacency].format(unit=self.unit)
        if self.public_seed:
            with_secret = replace(self, public_seed=False).summary()
            return (
                f"TOY RUN: the {self.mechanism} release satisfies NO privacy guarantee. Its "
                f"random seed is public (written in a configuration file), so anyone who knows "
                f"it can recompute the noise and undo it: use it on public or toy data only. "
                f"With a secret seed the same mechanism would promise: {with_secret}"
            )
        if math.isinf(self.epsilon):
            return (
                f"The {self.mechanism} release is NOT PRIVATE: it satisfies no differential "
                f"privacy guarantee (ε = ∞). Its outputs were computed from the private data "
                f"with no privacy mechanism (no clipping, no noise), so a single {self.unit} "
                f"can change them arbitrarily (with respect to {neighbours}). It is a "
                f"non-private reference point for experiments, never a private release."
            )
        if not self.ex_ante and self.details.get("unproven"):
            return (
                f"The {self.mechanism} release does NOT satisfy a differential privacy "
                f"guarantee that dplang can prove. Its accounting claims (ε = "
                f"{self.epsilon:.4g}, δ = {self.delta:.3g}) with respect to {neighbours}, "
                f"but rests on an assumption dplang cannot prove: "
                f"{self.details['unproven']}. It reproduces a paper's numbers; it is never "
                f"charged as a private release."
            )
        if not self.ex_ante:
            return (
                f"The {self.mechanism} release does NOT satisfy differential privacy. Its "
                f"accounting is DATA-DEPENDENT: it stops once a privacy estimate, computed "
                f"from the private data itself (with respect to {neighbours}), would exceed "
                f"ε = {self.epsilon:.4g} at δ = {self.delta:.3g}. That estimate is not "
                f"privatised and differs between neighbouring data sets, so (ε, δ) here is a "
                f"stopping target, not a bound on how much any single {self.unit} can change "
                f"the probability of an output."
            )
        if self.rho is not None:
            level = (
                f"{self.rho:.6g}-zero-concentrated differential privacy (zCDP), which implies "
                f"({self.epsilon:.4g}, {self.delta:.3g})-differential privacy"
            )
        elif self.delta == 0:
            level = f"pure {self.epsilon:.4g}-differential privacy"
        else:
            level = f"({self.epsilon:.4g}, {self.delta:.3g})-differential privacy"
        return (
            f"The {self.mechanism} release satisfies {level} with respect to {neighbours}: "
            f"whatever any single {self.unit} contains, the probability of any output changes "
            f"by at most a factor e^{self.epsilon:.4g} (plus {self.delta:.3g}) when that "
            f"{self.unit} is changed this way. This bound is fixed before the data is read "
            f"(ex ante)."
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (inverse: :meth:`from_dict`). ``public_seed`` appears only
        when True (a toy run), so other releases' records are unchanged."""
        out = asdict(self)
        out["adjacency"] = self.adjacency.value
        if not self.public_seed:
            del out["public_seed"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Guarantee:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Guarantee fields: {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> Guarantee:
        return cls.from_dict(json.loads(text))


def _details(details: Mapping[str, Any] | None) -> dict[str, Any]:
    return {} if details is None else dict(details)


class GuaranteeSource(Protocol):
    """A calibrated mechanism (its frozen, public parameters), with the one signature every
    params object, sampler and algorithm of dplang gives :meth:`guarantee`."""

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """What one release with these parameters promises, on data of ``n`` records of
        dimension ``d`` (both public under the adjacency the guarantee states). Mechanisms
        whose guarantee does not depend on them ignore them; those whose guarantee does
        refuse ``None`` (``ValueError``)."""
        ...
