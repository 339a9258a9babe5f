"""The row-invariance check on record: skipped only for the very configuration that passed."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_a_failure_is_never_recorded(tiny_llama_dir: Path, cache: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    original = attention.attend

    def leaky(q, *args, **kwargs):  # results that depend on the number of rows in the call
        return original(q, *args, **kwargs) * (1 + 1e-6 * q.shape[0])

    monkeypatch.setattr(decoder, "attend", leaky)
    for _ in range(2):  # refused both times: nothing was recorded by the first
        with pytest.raises(RowInvarianceError):
            TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert not list(cache.glob("*.json")) if cache.exists() else True


def test_the_key_covers_weights_and_backend_source(tiny_llama_dir: Path, cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance=False)
    key = inv._record_key(model)
    monkeypatch.setattr(model, "_digest", "0" * 64)
    assert inv._record_key(model) != key
    monkeypatch.setattr(inv, "_BACKEND_MODULES", ("invariance.py",))
    monkeypatch.setattr(model, "_digest", None)
    assert inv._record_key(model) != key
