"""The row-invariance check on record: skipped only for the very configuration that passed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dplang.models import TransformersModel, attention, decoder
from dplang.models import invariance as inv
from dplang.models.invariance import RowInvarianceError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(inv.RECHECK_ENV, raising=False)
    return tmp_path / "cache" / "invariance"


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from dplang.models import transformers as backend

    calls: list[int] = []
    real = inv.check_row_invariance

    def counted(model: TransformersModel) -> None:
        calls.append(1)
        real(model)

    monkeypatch.setattr(inv, "check_row_invariance", counted)
    monkeypatch.setattr(backend, "check_row_invariance", counted)
    return calls


def test_a_pass_is_recorded_and_reused_for_the_same_configuration(
        tiny_llama_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _calls(monkeypatch)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1] and len(list(cache.glob("*.json"))) == 1
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1]  # the same configuration: on record
    # anything in the numerics is another configuration: checked again, recorded apart
    TransformersModel(tiny_llama_dir, threads=2, block_size=8, check_invariance="cached")
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, dtype="bfloat16",
                      check_invariance="cached")
    assert calls == [1, 1, 1] and len(list(cache.glob("*.json"))) == 3
    monkeypatch.setenv(inv.RECHECK_ENV, "1")  # forced
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert len(calls) == 4
    # a plain check_invariance=True never reads the record
    monkeypatch.delenv(inv.RECHECK_ENV)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4)
    assert len(calls) == 5


def _passes(cache: Path) -> list[Path]:
    return [p for p in cache.glob("*.json") if not p.name.endswith(".refused.json")]


def _leaky(original):
    def leaky(q, *args, **kwargs):  # results that depend on the number of rows in the call
        return original(q, *args, **kwargs) * (1 + 1e-6 * q.shape[0])

    return leaky


def test_a_refusal_is_recorded_and_refused_at_once_next_time(
        tiny_llama_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from dplang.models import cpu_kernels
    from dplang.models.default import check_refusal_on_record

    monkeypatch.setattr(cpu_kernels, "_NUMBA", cpu_kernels._NUMBA)  # restored afterwards
    monkeypatch.setattr(decoder, "attend", _leaky(attention.attend))
    monkeypatch.setattr(cpu_kernels, "attend_tokens", _leaky(cpu_kernels.attend_tokens))
    with pytest.raises(RowInvarianceError, match="reference arithmetic"):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert len(list(cache.glob("*.refused.json"))) == 1 and not _passes(cache)
    calls = _calls(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(RowInvarianceError, match="refused earlier on this machine"):
        check_refusal_on_record(str(tiny_llama_dir), block_size=4)  # no weight loaded
    assert time.perf_counter() - start < 1.0
    with pytest.raises(RowInvarianceError, match="refused earlier"):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == []  # refused from the record, the check did not run
    monkeypatch.setenv(inv.RECHECK_ENV, "1")  # forced: checked (and refused) again
    with pytest.raises(RowInvarianceError):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls


def test_a_misbehaving_fast_path_falls_back_to_the_reference_arithmetic(
        tiny_llama_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dplang.models import cpu_kernels

    if not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("numba is not installed: there is no fast path to fall back from")
    monkeypatch.setattr(cpu_kernels, "_NUMBA", cpu_kernels._NUMBA)  # restored afterwards
    monkeypatch.setattr(cpu_kernels, "attend_tokens", _leaky(cpu_kernels.attend_tokens))
    with pytest.warns(UserWarning, match="reference arithmetic"):
        model = TransformersModel(tiny_llama_dir, threads=2, block_size=4,
                                  check_invariance="cached")
    assert not cpu_kernels.available(torch.zeros(1))
    assert {linear.kernel for linear in model._decoder._linears()} == {"float32"}
    model.check_row_invariance()  # and it is row-invariant
    records = _passes(cache)
    assert len(records) == 1 and '"reference"' in records[0].read_text()


def test_the_key_covers_weights_and_backend_source(tiny_llama_dir: Path, cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance=False)
    key = inv._record_key(model)
    monkeypatch.setattr(model, "_digest", "0" * 64)
    assert inv._record_key(model) != key
    monkeypatch.setattr(inv, "_BACKEND_MODULES", ("invariance.py",))
    monkeypatch.setattr(model, "_digest", None)
    assert inv._record_key(model) != key
