"""The first run's note that the CPU kernels are being compiled (a message only: the kernels
give the same bits compiled or read from numba's cache)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.cli.console import RichDisplay
from dplang.models import ToyModel, cpu_kernels, records

NOTE = "compiles its CPU kernels"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DPLANG_NO_KERNELS", raising=False)
    monkeypatch.setattr(cpu_kernels, "_DISABLED", False)
    return tmp_path / "cache"


def test_expected_until_recorded_for_this_copy_of_the_kernels(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numba")
    assert cpu_kernels.compile_expected()
    cpu_kernels.record_compiled()
    assert not cpu_kernels.compile_expected()
    assert [p.parent.name for p in cache.rglob("compiled-*.json")] == ["kernels"]
    # numba's cache is keyed by the source file's stamp: a reinstalled copy compiles again
    stamps = records.file_stamps
    with monkeypatch.context() as patched:
        patched.setattr(records, "file_stamps",
                        lambda paths: [[*s[:2], s[2] + 1] for s in stamps(paths)])
        assert cpu_kernels.compile_expected()
    assert not cpu_kernels.compile_expected()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache / "elsewhere"))  # another numba cache
    assert cpu_kernels.compile_expected()


def test_not_expected_where_the_kernels_do_not_run(cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPLANG_NO_KERNELS", "1")
    assert not cpu_kernels.compile_expected()
    monkeypatch.delenv("DPLANG_NO_KERNELS")
    monkeypatch.setattr(cpu_kernels, "_DISABLED", True)
    assert not cpu_kernels.compile_expected()


def test_the_first_run_says_so_while_loading_and_the_next_does_not(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numba")
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(f"review {i} was fine" for i in range(6)) + "\n")
    shown: list[str] = []

    @contextlib.contextmanager
    def status(self, message: str):
        shown.append(message)
        yield

    monkeypatch.setattr(RichDisplay, "status", status)
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    for run in ("a", "b"):
        assert main(["generate", "--data", str(data), "--out", str(tmp_path / f"{run}.jsonl"),
                     "--epsilon", "3", "-B", "3", "-T", "2", "--device", "cpu"]) == 0
    assert [NOTE in message for message in shown] == [True, False]
    assert all(message.startswith("reading the data and loading the model") for message in shown)
