"""Seeded random streams: one independent generator per unit index.

A *unit* is whatever must be reproducible on its own: a generation group, a candidate
statement, a simulation run. ``RandomStreams(seed).generator(i)`` is a pure function of
``(seed, i)`` — built from ``numpy.random.SeedSequence(seed, spawn_key=(i,))``, exactly the
child that ``SeedSequence(seed).spawn`` would give at position ``i`` — so a unit's draws do not
depend on how many other units ran before it, on concurrency, on resume, or on the machine
(``docs/privacy.md`` invariant 5).

``RandomStreams.from_os_entropy()`` draws a fresh 128-bit root from the operating system
instead; such a run cannot be reproduced or resumed bit-for-bit, and the root is not recorded.

Note: numpy's PCG64 is a statistical, not a cryptographic, generator. Floating-point samplers
also have the known floating-point caveats (Mironov 2012); the exact integer samplers in
:mod:`dplang.privacy.mechanisms` avoid the latter.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np


class StreamSource(Protocol):
    """Anything that hands out a unit's generator: :class:`RandomStreams` (which holds the
    root seed) or :class:`StreamStates` (which holds only some units' initial states)."""

    def generator(self, index: int) -> np.random.Generator:
        """A fresh generator for unit ``index`` (the same draws every time)."""
        ...


class RandomStreams:
    """Independent, reproducible generators indexed by unit number."""

    def __init__(self, seed: int | None, *, os_entropy: bool = False) -> None:
        if os_entropy:
            if seed is not None:
                raise ValueError("give either a seed or os_entropy=True, not both")
            self._root = secrets.randbits(128)
        else:
            if seed is None:
                raise ValueError("a seed is required (or use RandomStreams.from_os_entropy())")
            if int(seed) < 0:
                raise ValueError(f"seed must be >= 0, got {seed}")
            self._root = int(seed)
        self.os_entropy = os_entropy
        self.seed = None if os_entropy else int(seed)  # type: ignore[arg-type]

    @classmethod
    def from_os_entropy(cls) -> RandomStreams:
        """Streams rooted at fresh operating-system entropy (not reproducible)."""
        return cls(None, os_entropy=True)

    def seed_sequence(self, index: int, *sub: int) -> np.random.SeedSequence:
        """The SeedSequence of unit ``index`` (optionally of a sub-stream ``sub``)."""
        if index < 0 or any(s < 0 for s in sub):
            raise ValueError("stream indices must be >= 0")
        return np.random.SeedSequence(self._root, spawn_key=(int(index), *map(int, sub)))

    def generator(self, index: int, *sub: int) -> np.random.Generator:
        """A fresh ``numpy.random.Generator`` for unit ``index``: same (seed, index) ⇒ same
        draws."""
        return np.random.Generator(np.random.PCG64(self.seed_sequence(index, *sub)))

    def initial_state(self, index: int, *sub: int) -> dict[str, Any]:
        """The initial ``bit_generator.state`` of unit ``index``'s generator: what a worker
        needs to draw exactly what :meth:`generator` would draw, without the root seed.

        Privacy note: the state is the output of numpy's ``SeedSequence`` hash of
        (root, index), which is *not* a cryptographic one-way function. Sending states instead
        of the root keeps the root out of workers' messages (separation of duties: one state
        opens one unit's stream), but a state should still be handled as a secret, like the
        references a worker receives with it."""
        return copy.deepcopy(self.generator(index, *sub).bit_generator.state)


class StreamStates:
    """The streams of some units, from their initial states only (see
    :meth:`RandomStreams.initial_state`): ``StreamStates({i: s}).generator(i)`` draws exactly
    what ``RandomStreams(seed).generator(i)`` draws, and the root seed is never needed.

    A unit whose state was not given raises ``KeyError`` (a worker asked for a stream it
    was not sent is a bug, never a fresh draw)."""

    def __init__(self, states: Mapping[int, Mapping[str, Any]]) -> None:
        self._states = {int(k): copy.deepcopy(dict(v)) for k, v in states.items()}

    def add(self, index: int, state: Mapping[str, Any]) -> None:
        """Register unit ``index``'s initial state (a worker, as its groups arrive)."""
        self._states[int(index)] = copy.deepcopy(dict(state))

    def __contains__(self, index: object) -> bool:
        return index in self._states

    def generator(self, index: int) -> np.random.Generator:
        """A fresh generator at unit ``index``'s initial state."""
        state = self._states[int(index)]
        if state.get("bit_generator") != "PCG64":
            raise ValueError(f"unit {index}: not a PCG64 state")
        bit_generator = np.random.PCG64()
        bit_generator.state = copy.deepcopy(state)
        return np.random.Generator(bit_generator)
