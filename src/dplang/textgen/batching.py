"""Data-independent partition of references into generation batches.

InvisibleInk produces one synthetic text per batch of ``B`` references, and each batch is
used by exactly one generation. The privacy of the whole release rests on *parallel
composition* (InvisibleInk paper, Corollary 11): if the references are split into
**disjoint** batches by a rule that is **agnostic to their content**, and each generation is
ρ-zCDP with respect to its own batch, then the tuple of all generations is ρ-zCDP with respect
to the data set -- the cost does not grow with the number of generations.

Why the partition built here is data-independent:

* The only inputs are each record's *position* in the file (``Record.index`` and the order
  of the records) and, with ``group_by``, the values of named label columns. The reference
  texts are never inspected -- not their length, their content, nor whether they are blank:
  a null reference (``Record.text is None``) keeps its place and is batched like any other
  (it renders as the public prompt). Under replace-by-null adjacency a neighbouring data set
  therefore has exactly the same batches, and the changed reference lies in one batch only.
  This is why batching must not cluster, sort or filter by text (the paper's footnote
  "This precludes partitioning based on clustering").
* Group labels (``group_by``) are treated as **PUBLIC metadata**: they decide which batch a
  reference joins and they are written into the public prompt. The guarantee covers the
  reference texts only; if a label is itself sensitive, do not group by it
  (docs/generation.md, Data: the paper's Yelp batching by category and stars is
  data-independent only on this reading).

Rule. Without ``group_by``: consecutive, disjoint chunks of exactly ``B`` records in file
order; there are ``⌊N/B⌋`` of them, and the remainder is not used. With ``group_by``: records
are grouped by the tuple of their label values (groups in order of first appearance), each
group is chunked the same way (its remainder dropped) and the batches are listed group by
group. ``num`` keeps the first ``num`` batches of that list; asking for more batches than
exist is refused rather than silently shrunk.

Order (``order``, with ``group_by``). ``"grouped"`` (the default) lists the batches group by
group, so the first ``num`` batches come from the first groups only: with ``num`` smaller than
the number of batches, the label mix of the generations is that of the first groups in the
file (on Yelp at B = 3 and num = 500, every text would be a Restaurants review).
``"interleaved"`` lists the same batches so that every prefix holds each group in proportion
to its number of batches: batch j of a group with m batches gets the key (j + ½)/m (ties by
group order) and the batches are sorted by key, so the first ``num`` hold num·m/M ± 1 of each
group (M batches in all). Both orders read positions and public labels only, and neither
changes which references form a batch, only which batches the first ``num`` are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dplang.io import Record

__all__ = ["BATCH_ORDERS", "Batch", "make_batches", "max_generations"]

#: How grouped batches are listed (see the module docstring); the first is the default.
BATCH_ORDERS = ("grouped", "interleaved")


@dataclass(frozen=True)
class Batch:
    """One generation's references.

    ``reference_ids`` are the ``Record.index`` values (file positions); ``references`` the
    texts in the same order, with ``""`` standing for a null reference (rendered as the public
    prompt). ``labels`` are the group-by label values shared by every reference of the batch
    (empty without ``group_by``); they are public and fill the prompt's label slots.
    """

    index: int
    reference_ids: tuple[int, ...]
    references: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.reference_ids)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ValueError(f"batch size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")


def max_generations(n_records: int, batch_size: int) -> int:
    """The largest number of disjoint batches of ``batch_size`` among ``n_records``: ⌊N/B⌋."""
    _check_batch_size(batch_size)
    if n_records < 0:
        raise ValueError(f"number of records must be non-negative, got {n_records}")
    return n_records // batch_size


def _batch(index: int, chunk: Sequence[Record], labels: dict[str, str]) -> Batch:
    return Batch(
        index=index,
        reference_ids=tuple(r.index for r in chunk),
        # The text is copied, never inspected: None (null reference) becomes "".
        references=tuple(r.text if r.text is not None else "" for r in chunk),
        labels=dict(labels),
    )


def make_batches(
    records: Iterable[Record],
    batch_size: int,
    num: int | None = None,
    group_by: Sequence[str] = (),
    order: str = "grouped",
) -> list[Batch]:
    """Partition ``records`` into disjoint batches of exactly ``batch_size`` (see module doc).

    ``num=None`` returns every full batch (``⌊N/B⌋`` without ``group_by``, the sum over
    groups of ``⌊N_g/B⌋`` with it); ``order`` lists grouped batches group by group
    (``"grouped"``) or in proportion (``"interleaved"``). Raises :class:`ValueError` when
    ``batch_size < 1``, ``num < 1``, there are fewer records than ``batch_size`` (or no group
    holds a full batch), ``num`` batches do not exist (``num·B > N`` without ``group_by``) or
    ``order`` is unknown.
    """
    _check_batch_size(batch_size)
    if order not in BATCH_ORDERS:
        raise ValueError(f"batch order must be one of {', '.join(BATCH_ORDERS)}, got {order!r}")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 1):
        raise ValueError(f"number of generations must be an integer of at least 1, got {num!r}")
    recs = list(records)
    n = len(recs)
    group_by = tuple(group_by)
    if n < batch_size:
        raise ValueError(
            f"batch size {batch_size} is larger than the number of references ({n}); "
            "lower the batch size"
        )

    if not group_by:
        available = n // batch_size
        if num is not None and num > available:
            raise ValueError(
                f"{num} generations of batch size {batch_size} need {num * batch_size} "
                f"references but only {n} are available (at most {available} generations)"
            )
        count = available if num is None else num
        return [_batch(j, recs[j * batch_size : (j + 1) * batch_size], {}) for j in range(count)]

    if len(set(group_by)) != len(group_by):
        raise ValueError(f"duplicate group-by columns: {group_by!r}")
    groups: dict[tuple[str, ...], list[Record]] = {}
    for rec in recs:
        try:
            key = tuple(rec.labels[c] for c in group_by)
        except KeyError:
            missing = [c for c in group_by if c not in rec.labels]
            raise ValueError(
                f"record {rec.index} has no label column(s) {', '.join(map(repr, missing))}; "
                "read the file with these columns"
            ) from None
        groups.setdefault(key, []).append(rec)
    available = sum(len(g) // batch_size for g in groups.values())
    if available == 0:
        raise ValueError(
            f"no group of {'/'.join(group_by)} holds {batch_size} references "
            f"(largest group: {max(len(g) for g in groups.values())}); lower the batch size"
        )
    if num is not None and num > available:
        raise ValueError(
            f"{num} generations of batch size {batch_size} requested but the "
            f"{len(groups)} groups of {'/'.join(group_by)} hold only {available} full batches"
        )
    count = available if num is None else num
    # (key, group rank, chunk within the group): grouped lists them group by group,
    # interleaved by the chunk's relative position (j + 1/2)/m in its group
    slots: list[tuple[float, int, int, tuple[str, ...]]] = []
    for rank, (key, members) in enumerate(groups.items()):
        m = len(members) // batch_size
        for j in range(m):
            slots.append((rank if order == "grouped" else (j + 0.5) / m, rank, j, key))
    slots.sort(key=lambda slot: slot[:3])
    batches: list[Batch] = []
    for _pos, _rank, j, key in slots[:count]:
        chunk = groups[key][j * batch_size : (j + 1) * batch_size]
        batches.append(_batch(len(batches), chunk, dict(zip(group_by, key, strict=True))))
    return batches
