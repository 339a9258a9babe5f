"""The exact decoder's torch definitions compute the same bits under a GPU's arithmetic rules.

A GPU runs the same torch definitions (where no Triton kernel is admitted, and as the
reference every Triton kernel's self-test compares with), but PyTorch's CUDA kernels differ
from its CPU ones in one rule that matters for bits: a tensor divided by a host number is
multiplied by the number's rounded reciprocal (``div_true_kernel_cuda``'s CPU-scalar path),
not divided. Where the number is not a power of two the result differs in the last bit for
about one value in twenty. Found by a review before any GPU run: ``amax / 32512`` in the
quantizer and ``/ hidden_size`` in the RMS norm made the GPU's definitions differ from its
Triton kernels (which divide correctly), so the self-tests would have refused the kernels.

These tests emulate that rule on the CPU (:class:`CudaDivision`) and check, through the real
decode of two architectures, that no division by a host number that is not a power of two is
left in the exact path, and that the hidden states and logits keep their bits under it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dplang.models import TransformersModel, kernels
from dplang.models.transformers import RowDecodeState

_DIVISIONS = {"div", "true_divide", "divide", "__truediv__", "__itruediv__", "div_"}


def _power_of_two(number: float) -> bool:
    mantissa, _ = math.frexp(abs(float(number)))
    return mantissa == 0.5


class CudaDivision(torch.overrides.TorchFunctionMode):
    """Computes ``float tensor / host number`` as PyTorch's CUDA kernel does:
    ``t * (1 / b)``, the reciprocal rounded in ``t``'s precision; records each such divisor
    that is not a power of two (there the two rules can differ)."""

    def __init__(self) -> None:
        super().__init__()
        self.inexact: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in _DIVISIONS and len(args) == 2 and not kwargs
                and isinstance(args[0], torch.Tensor) and args[0].is_floating_point()
                and isinstance(args[1], (int, float)) and not isinstance(args[1], bool)):
            t, number = args
            if not _power_of_two(number):
                self.inexact.append(float(number))
            one = torch.ones((), dtype=t.dtype)
            reciprocal = one / torch.full((), float(number), dtype=t.dtype)
            product = t * reciprocal
            if name.startswith("__i") or name.endswith("_"):
                return t.copy_(product)
            return product
        return func(*args, **kwargs)


def _decode(model: TransformersModel) -> list[torch.Tensor]:
    state = RowDecodeState(prompts=[[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16]])
    seen = []
    hidden = model.next_hidden(state, None)
    seen += [hidden, model.logits_from_hidden(hidden),
             model.logits_from_hidden(hidden, torch.tensor([[3, 4, 5, 3]] * 3))]
    for step in range(4):
        hidden = model.next_hidden(state, torch.tensor([3 + step, 4, 5]))
        seen += [hidden, model.logits_from_hidden(hidden)]
    return seen


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_exact_path_has_the_same_bits_under_a_gpus_division(
        arch: str, tiny_llama_dir: Path, tiny_gemma_dir: Path) -> None:
    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    with kernels.definitions_only():
        plain = _decode(TransformersModel(folder, threads=1, block_size=4))
        mode = CudaDivision()
        with mode:  # the weights are rounded at the load under the same rule (the load's
            # check against the model's own float forward, not exact, is left out)
            model = TransformersModel(folder, threads=1, block_size=4, verify=False)
        with mode:
            emulated = _decode(model)
    assert mode.inexact == [], f"divisions by host numbers left: {sorted(set(mode.inexact))}"
    for a, b in zip(plain, emulated, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_emulation_sees_the_difference() -> None:
    """The emulated rule differs from a division where it should (else the test above could
    not fail): 32,512 levels, the quantizer's."""
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    with CudaDivision() as mode:
        emulated = x / 32512
    assert mode.inexact == [32512.0]
    assert not torch.equal(emulated, x / 32512)
    assert torch.equal(x / 32512, x / torch.full((), 32512.0))


@pytest.mark.parametrize("width", [48, 96, 640, 1000])
def test_the_exact_functions_keep_their_bits_at_widths_not_powers_of_two(width: int) -> None:
    """The tiny models' sizes are powers of two, where a reciprocal is exact: the RMS norm's
    mean (``/ width``) and the quantizer are checked here at other widths (Gemma 3 270M's
    hidden size is 640), under the GPU rule, with no host-number divisor left."""
    from dplang.models import exact

    g = torch.Generator().manual_seed(width)
    x = torch.randn(64, width, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    w = 1 + torch.randn(width, generator=g) * 0.1
    with kernels.definitions_only():
        plain = [exact.rms_norm(x, w, 1e-5), *exact.quantize_rows(x, exact.TWO_LIMB_LEVELS),
                 exact.prepare_rows(x).limbs]
        mode = CudaDivision()
        with mode:
            emulated = [exact.rms_norm(x, w, 1e-5),
                        *exact.quantize_rows(x, exact.TWO_LIMB_LEVELS),
                        exact.prepare_rows(x).limbs]
    assert mode.inexact == []
    for a, b in zip(plain, emulated, strict=True):
        assert torch.equal(a, b) and torch.equal(a.view(torch.int32) if a.dtype ==
                                                 torch.float32 else a,
                                                 b.view(torch.int32) if b.dtype ==
                                                 torch.float32 else b)
