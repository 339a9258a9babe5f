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
def test_integer_weights_do_not_depend_on_releasing_the_source(tmp_path: Path) -> None:
    values = np.random.default_rng(1).standard_normal((300, 96)).astype(np.float32)
    kept = IntegerLinear(torch.from_numpy(values), weight_bits=16, layout="nk")
    released = IntegerLinear(_mapped(tmp_path, values), weight_bits=16, layout="nk",
                             release_source=True)
    for a, b in zip(kept.limbs, released.limbs, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(kept.col_scale, released.col_scale)
    x = torch.randn(5, 96)
    assert torch.equal(kept(x), released(x))
