"""The decoding state of the transformers backend: each row's slot in the key/value store and
the rows still decoded (:class:`RowDecodeState`). A leaf of :mod:`dplang.models.transformers`
(which re-exports both names), so that the load-time check (:mod:`dplang.models.invariance`)
builds a state without importing the backend that imports the check.

Privacy contract: none by itself; each row's slot holds only that row's keys and values, which
is what the row-invariance check verifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dplang.models.attention import SlotCache

__all__ = ["RowDecodeState", "RowSlot"]


@dataclass
class RowSlot:
    """A row's slot in the key/value store and its number of cached positions."""

    slot: int
    length: int = 0


@dataclass
class RowDecodeState:
    """Decoding state of :class:`TransformersModel`: one entry per row still decoded.

    Attributes:
        prompts: each row's prompt token ids (run by the first :meth:`next_hidden` call after
            the row was added; after its shared prefix, if it has one).
        caches: each row's :class:`RowSlot`, or ``None`` for a row whose prompt has not run.
        prefix_of, prefixes: shared public prefixes (see :meth:`TransformersModel.add_prompts`).
        cache: the key/value store (created by the first call that runs a prompt).
        steps: number of :meth:`next_hidden` calls so far.
    """

    prompts: list[list[int]]
    caches: list[RowSlot | None] = field(default_factory=list)
    cache: SlotCache | None = None
    steps: int = 0
    #: Per row, the token ids of its shared public prefix (``None``: no prefix); the row's
    #: tokens are the prefix's followed by ``prompts[row]``.
    prefix_of: list[tuple[int, ...] | None] = field(default_factory=list)
    #: Computed prefixes: their slot (owned by the state) and last hidden state.
    prefixes: dict[tuple[int, ...], tuple[RowSlot, torch.Tensor]] = field(default_factory=dict)
    #: Positions to keep after each new row's prompt for the tokens it will generate (a
    #: capacity hint, :meth:`TransformersModel.reserve_new_tokens`: no bit depends on it).
    new_tokens: int = 0

    def __post_init__(self) -> None:
        if len(self.caches) < len(self.prompts):
            self.caches.extend([None] * (len(self.prompts) - len(self.caches)))
        if len(self.prefix_of) < len(self.prompts):
            self.prefix_of.extend([None] * (len(self.prompts) - len(self.prefix_of)))

    @property
    def rows(self) -> int:
        """Number of rows still decoded."""
        return len(self.prompts)

    @property
    def started(self) -> bool:
        """Whether some row's prompt has been run through the model."""
        return any(c is not None for c in self.caches)

    @property
    def prompt_lengths(self) -> list[int]:
        """Number of prompt tokens of every row."""
        return [len(p) for p in self.prompts]
