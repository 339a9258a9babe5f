"""Releasing a loaded weight's file pages changes memory only, never a value."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dplang.models.exact import IntegerLinear
from dplang.models.memory import release_file_pages

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on Linux")


def _mapped(tmp_path: Path, values: np.ndarray) -> torch.Tensor:
    """A float32 tensor whose bytes are a private mapping of a file (as safetensors loads)."""
    path = tmp_path / "weights.bin"
    values.astype(np.float32).tofile(path)
    return torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c", shape=values.shape))


@linux
def test_file_pages_are_dropped_and_read_back_unchanged(tmp_path: Path) -> None:
    values = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    tensor = _mapped(tmp_path, values)
    assert float(tensor.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # resident
    assert release_file_pages(tensor) >= 512 * 1024 * 4 - 2 * 4096
    assert torch.equal(tensor, torch.from_numpy(values))  # read back from the file


@linux
def test_anonymous_memory_is_never_advised() -> None:
    tensor = torch.randn(512, 1024)
    copy = tensor.clone()
    assert release_file_pages(tensor) == 0
    assert torch.equal(tensor, copy)


def test_non_contiguous_and_empty_tensors_are_left_alone() -> None:
    assert release_file_pages(torch.randn(64, 64).t()) == 0
    assert release_file_pages(torch.empty(0)) == 0


@linux
def test_a_written_page_is_never_dropped(tmp_path: Path) -> None:
    """A page written in a private file mapping is a private copy: dropping it would bring the
    file's old values back, so the range is left alone."""
    values = np.random.default_rng(2).standard_normal((512, 1024)).astype(np.float32)
    tensor = _mapped(tmp_path, values)
    tensor.mul_(2.0)
    assert release_file_pages(tensor) == 0
    assert torch.equal(tensor, torch.from_numpy(values) * 2.0)


@linux
def test_integer_weights_do_not_depend_on_releasing_the_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dplang.models import exact

    dropped: list[int] = []

    def counted(tensor: torch.Tensor) -> int:
        dropped.append(release_file_pages(tensor))
        return dropped[-1]

    monkeypatch.setattr(exact, "release_file_pages", counted)
    values = np.random.default_rng(1).standard_normal((8192, 96)).astype(np.float32)
    kept = IntegerLinear(torch.from_numpy(values), weight_bits=16, layout="nk")
    source = _mapped(tmp_path, values)
    released = IntegerLinear(source, weight_bits=16, layout="nk", release_source=True)
    assert sum(dropped) > 0  # the source's pages were dropped as the blocks were rounded
    for a, b in zip(kept.limbs, released.limbs, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(kept.col_scale, released.col_scale)
    assert torch.equal(source, torch.from_numpy(values))  # read back, unchanged
    x = torch.randn(5, 96)
    assert torch.equal(kept(x), released(x))


def test_the_int16_store_keeps_its_integers_through_growth_and_poison() -> None:
    """Keys and values are int16 on the CPU: what is written is read back as the same
    integers after the store grows (slots and positions), and a poisoned slot holds the
    largest magnitude of the right sign without touching the others."""
    from dplang.models.attention import SlotCache

    cache = SlotCache(num_layers=2, kv_heads=1, head_dim=8, block=4,
                      device=torch.device("cpu"))
    assert cache.dtype == torch.int16
    first = cache.allocate()
    cache.reserve(3)
    keys = torch.randn(3, 1, 8)
    values = torch.randn(3, 1, 8)
    slots = torch.full((3,), first)
    positions = torch.arange(3)
    for layer in range(2):
        cache.write(layer, slots, positions, keys, values)
    before = [(k[first, :, :3].clone(), v[first, :, :3].clone())
              for k, v in zip(cache.keys, cache.values, strict=True)]
    assert all(k.dtype == torch.int16 and k.abs().max() > 0 for k, _ in before)
    others = [cache.allocate() for _ in range(6)]  # the slot count grows
    cache.reserve(9)  # and the capacity
    for (k, v), keys_now, values_now in zip(before, cache.keys, cache.values, strict=True):
        assert torch.equal(keys_now[first, :, :3], k)
        assert torch.equal(values_now[first, :, :3], v)
    cache.poison(others[0])
    cache.poison(others[1], -1e30)
    assert int(cache.keys[0][others[0]].min()) == 32767
    assert int(cache.values[1][others[1]].max()) == -32767
    assert torch.equal(cache.keys[0][first, :, :3], before[0][0])
