"""Tests for dplang.textgen.batching: the data-independent partition."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.io import Record
from dplang.textgen.batching import Batch, make_batches, max_generations


def recs(n: int, labels: list[dict[str, str]] | None = None) -> list[Record]:
    return [
        Record(index=i, text=f"text {i}", labels=(labels[i] if labels else {})) for i in range(n)
    ]


def assert_disjoint(batches: list[Batch]) -> None:
    seen: set[int] = set()
    for b in batches:
        assert not seen & set(b.reference_ids)
        assert len(set(b.reference_ids)) == len(b.reference_ids)
        seen |= set(b.reference_ids)


def test_consecutive_chunks_in_file_order() -> None:
    batches = make_batches(recs(10), 3)
    assert len(batches) == 3 == max_generations(10, 3)
    assert [b.reference_ids for b in batches] == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    assert batches[1].references == ("text 3", "text 4", "text 5")
    assert [b.index for b in batches] == [0, 1, 2]
    assert all(b.labels == {} and b.size == 3 for b in batches)
    assert_disjoint(batches)


def test_num_takes_first_batches() -> None:
    batches = make_batches(recs(10), 2, num=3)
    assert [b.reference_ids for b in batches] == [(0, 1), (2, 3), (4, 5)]
    assert len(make_batches(recs(10), 2, num=5)) == 5


def test_reference_ids_are_file_positions() -> None:
    records = [Record(i, f"t{i}") for i in (0, 2, 3, 7, 8, 9)]  # rows 1, 4-6 were skipped
    assert [b.reference_ids for b in make_batches(records, 2)] == [(0, 2), (3, 7), (8, 9)]


def test_null_references_keep_their_place() -> None:
    records = [Record(0, "a"), Record(1, None), Record(2, "c"), Record(3, "d")]
    batches = make_batches(records, 2)
    assert batches[0].reference_ids == (0, 1)
    assert batches[0].references == ("a", "")


@pytest.mark.parametrize(
    "n,b,num,match",
    [
        (10, 3, 4, r"4 generations of batch size 3 need 12 references but only 10"),
        (2, 3, None, "larger than the number of references"),
        (10, 0, None, "at least 1"),
        (10, 2, 0, "at least 1"),
        (10, -1, None, "at least 1"),
        (0, 1, None, "larger than the number of references"),
    ],
)
def test_refusals(n: int, b: int, num: int | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_batches(recs(n), b, num=num)


def test_max_generations() -> None:
    assert max_generations(1013, 127) == 7
    assert max_generations(1013, 7) == 144
    assert max_generations(0, 5) == 0
    with pytest.raises(ValueError):
        max_generations(10, 0)
    with pytest.raises(ValueError):
        max_generations(-1, 2)


def test_group_by_batches_stay_in_one_group() -> None:
    cats = ["A", "B", "A", "A", "C", "B", "A", "B", "A", "B", "C"]
    stars = ["5", "5", "5", "1", "5", "5", "5", "5", "5", "5", "5"]
    labels = [{"cat": c, "stars": s} for c, s in zip(cats, stars, strict=True)]
    records = recs(len(cats), labels)
    batches = make_batches(records, 2, group_by=("cat", "stars"))
    by_id = {r.index: r for r in records}
    for b in batches:
        for i in b.reference_ids:
            assert {k: by_id[i].labels[k] for k in ("cat", "stars")} == b.labels
    # groups in order of first appearance: (A,5): 0,2,6,8 ; (B,5): 1,5,7,9 ; (A,1): 3 ; (C,5): 4,10
    assert [b.reference_ids for b in batches] == [(0, 2), (6, 8), (1, 5), (7, 9), (4, 10)]
    assert [b.labels for b in batches][:3] == [
        {"cat": "A", "stars": "5"},
        {"cat": "A", "stars": "5"},
        {"cat": "B", "stars": "5"},
    ]
    assert [b.index for b in batches] == list(range(5))
    assert_disjoint(batches)
    assert [b.reference_ids for b in make_batches(records, 2, num=3, group_by=("cat",))] == [
        (0, 2),
        (3, 6),
        (1, 5),
    ]


def test_group_by_refusals() -> None:
    labels = [{"g": str(i % 3)} for i in range(6)]  # three groups of 2
    records = recs(6, labels)
    with pytest.raises(ValueError, match="no group of g holds 3"):
        make_batches(records, 3, group_by=("g",))
    with pytest.raises(ValueError, match="hold only 3 full batches"):
        make_batches(records, 2, num=4, group_by=("g",))
    with pytest.raises(ValueError, match="no label column"):
        make_batches(records, 2, group_by=("other",))


@st.composite
def partition_case(draw: st.DrawFn) -> tuple[list[Record], list[Record], int, int | None, tuple]:
    n = draw(st.integers(1, 60))
    b = draw(st.integers(1, n))
    grouped = draw(st.booleans())
    labels = [{"g": draw(st.sampled_from("xyz"))} if grouped else {} for _ in range(n)]
    texts = draw(st.lists(st.one_of(st.none(), st.text(max_size=20)), min_size=n, max_size=n))
    perm = draw(st.permutations(range(n)))
    other_texts = draw(st.lists(st.one_of(st.none(), st.text(max_size=20)), min_size=n, max_size=n))
    # positions (indices) and labels are fixed; only the texts change
    a = [Record(i, texts[i], labels[i]) for i in range(n)]
    permuted = [Record(i, texts[perm[i]], labels[i]) for i in range(n)]
    replaced = [Record(i, other_texts[i], labels[i]) for i in range(n)]
    group_by = ("g",) if grouped else ()
    num = draw(st.one_of(st.none(), st.integers(1, 3)))
    return a, [permuted, replaced], b, num, group_by  # type: ignore[return-value]


def _ids_or_error(records: list[Record], b: int, num: int | None, group_by: tuple) -> object:
    try:
        batches = make_batches(records, b, num=num, group_by=group_by)
    except ValueError as exc:
        return ("error", str(exc))
    return [(x.reference_ids, x.labels) for x in batches]


@settings(max_examples=200, deadline=None)
@given(partition_case())
def test_batches_never_depend_on_text(case) -> None:
    a, variants, b, num, group_by = case
    expected = _ids_or_error(a, b, num, group_by)
    for variant in variants:
        assert _ids_or_error(variant, b, num, group_by) == expected
    if not isinstance(expected, tuple):
        batches = make_batches(a, b, num=num, group_by=group_by)
        assert_disjoint(batches)
        assert all(x.size == b for x in batches)
        by_id = {r.index: r for r in a}
        for x in batches:  # references are the texts at those positions ("" for null)
            assert x.references == tuple(by_id[i].text or "" for i in x.reference_ids)
        if not group_by:
            assert len(batches) == (num or max_generations(len(a), b))
            flat = [i for x in batches for i in x.reference_ids]
            assert flat == list(range(len(flat)))


@settings(max_examples=100, deadline=None)
@given(partition_case())
def test_interleaved_order_is_a_reordering_that_never_depends_on_text(case) -> None:
    a, variants, b, num, group_by = case
    expected = _ids_or_error_ordered(a, b, num, group_by)
    for variant in variants:
        assert _ids_or_error_ordered(variant, b, num, group_by) == expected
    if not isinstance(expected, tuple):
        grouped = make_batches(a, b, group_by=group_by)
        interleaved = make_batches(a, b, group_by=group_by, order="interleaved")
        assert sorted(x.reference_ids for x in grouped) == \
            sorted(x.reference_ids for x in interleaved)  # the same batches, reordered
        assert [x.index for x in interleaved] == list(range(len(interleaved)))


def _ids_or_error_ordered(records: list[Record], b: int, num: int | None,
                          group_by: tuple) -> object:
    try:
        batches = make_batches(records, b, num=num, group_by=group_by, order="interleaved")
    except ValueError as exc:
        return ("error", str(exc))
    return [(x.reference_ids, x.labels) for x in batches]


def test_interleaved_prefixes_hold_every_group_in_proportion() -> None:
    """Grouped generation with num below the number of batches: "grouped" takes the first
    groups only (every text from group a here), "interleaved" takes each group in proportion
    to its batches (60 : 30 : 9 rows → 20 : 10 : 3 batches of 3)."""
    labels = [{"g": "a" if i < 60 else ("b" if i < 90 else "c")} for i in range(99)]
    grouped = make_batches(recs(99, labels), 3, num=11, group_by=("g",))
    assert {x.labels["g"] for x in grouped} == {"a"}
    mixed = make_batches(recs(99, labels), 3, num=11, group_by=("g",), order="interleaved")
    counts = {g: sum(x.labels["g"] == g for x in mixed) for g in "abc"}
    assert counts == {"a": 7, "b": 3, "c": 1}  # 11·20/33 = 6.7, 11·10/33 = 3.3, 11·3/33 = 1
    assert_disjoint(mixed)
    for num in range(1, 34):  # every prefix: each group within one batch of its share
        prefix = make_batches(recs(99, labels), 3, num=num, group_by=("g",),
                              order="interleaved")
        for g, m in (("a", 20), ("b", 10), ("c", 3)):
            assert abs(sum(x.labels["g"] == g for x in prefix) - num * m / 33) <= 1
    assert make_batches(recs(10), 2, order="interleaved") == make_batches(recs(10), 2)
    with pytest.raises(ValueError, match="batch order"):
        make_batches(recs(10), 2, order="random")
