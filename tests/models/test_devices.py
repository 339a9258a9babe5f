"""``--device``: resolution, the device type in the model's identity, and the
CUDA path of the transformers backend (``@pytest.mark.gpu``: skipped without a CUDA GPU).

No claim about GPU speed is made or tested here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dplang.models import TransformersModel
from dplang.models import devices as dev
from dplang.privacy import RandomStreams
from dplang.textgen.engine import DecodingParams, GroupJob
from dplang.textgen.methods.invisibleink import run_invisibleink


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dev.resolve_device("cpu") == "cpu"
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    assert dev.resolve_device("auto") == "cpu"
    with pytest.raises(dev.DeviceError, match=r"^--device cuda: no CUDA GPU") as err:
        dev.resolve_device("cuda")
    assert "\n" not in str(err.value)
    with pytest.raises(dev.DeviceError, match="--device must be one of"):
        dev.resolve_device("tpu")
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    assert dev.resolve_device("auto") == dev.resolve_device("cuda") == "cuda"


def test_the_device_type_is_part_of_the_models_numerics(tiny_llama_dir: Path) -> None:
    m = TransformersModel(tiny_llama_dir, threads=1)
    assert m.device_type == "cpu" and m.numerics["device"] == "cpu"
    with pytest.raises(ValueError, match="device must be cpu or cuda"):
        TransformersModel(tiny_llama_dir, threads=1, device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_model_without_a_gpu_is_refused(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        TransformersModel(tiny_llama_dir, threads=1, device="cuda")


def _jobs(n: int) -> list[GroupJob]:
    return [GroupJob(g, "Another:", tuple(f"Here: review {g}-{i}\nAnother:" for i in range(3)))
            for g in range(n)]


@pytest.mark.gpu
def test_cuda_backend_is_row_invariant_or_refused(tiny_llama_dir: Path) -> None:
    """On a GPU: the model loads on CUDA only if its load-time row-invariance check passes;
    when it does, a group's text does not depend on the groups beside it, and logits come back
    on the CPU. A refusal is reported as a failure to run on this GPU, not hidden."""
    from dplang.models.invariance import RowInvarianceError

    try:
        m = TransformersModel(tiny_llama_dir, threads=1, device="cuda")
    except RowInvarianceError as exc:
        pytest.fail(f"the CUDA configuration is not row-invariant here: {exc}")
    assert m.numerics["device"] == "cuda"
    assert m.model is None  # the float model is dropped once its integer copy is made
    assert m._decoder.final_norm.weight.device.type == "cuda"
    state = m.encode_prompts(["Hello there", "Paris"])
    logits = m.next_logits(state, None)
    assert logits.device.type == "cpu" and logits.dtype == torch.float32
    params = DecodingParams(clip=1.0, batch_size=3, temperature=1.0, top_k=5, max_tokens=6)
    base = {r.index: r.token_ids for r in run_invisibleink(m, _jobs(4), params,
                                                           RandomStreams(3), 1)}
    for g in (2, 4):
        got = run_invisibleink(m, _jobs(4), params, RandomStreams(3), g)
        assert {r.index: r.token_ids for r in got} == base
