"""The first run's note that the CPU kernels are being compiled (a message only: the kernels
give the same bits compiled or read from numba's cache)."""

from __future__ import annotations

import contextlib
import importlib.util
import stat
import sys
from pathlib import Path

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.cli.console import RichDisplay
from dplang.models import ToyModel, cpu_kernels, records

NOTE = "compiles its CPU kernels"
#: numba itself is not imported here: it reads NUMBA_CACHE_DIR once, at its import, which must
#: be dplang's (cpu_kernels._load), not this test's.
needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba is not installed: no kernels to compile")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DPLANG_NO_KERNELS", raising=False)
    monkeypatch.setattr(cpu_kernels, "_DISABLED", False)
    return tmp_path / "cache"


@needs_numba
def test_expected_until_recorded_for_this_copy_of_the_kernels(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    # another numba cache: as set for a numba not imported yet, as numba chose it once it is
    with monkeypatch.context() as patched:
        patched.delitem(sys.modules, "numba", raising=False)
        patched.setenv("NUMBA_CACHE_DIR", str(cache / "elsewhere"))
        assert cpu_kernels.compile_expected()
    assert not cpu_kernels.compile_expected()
    cpu_kernels._load()
    import numba.core.config

    monkeypatch.setattr(numba.core.config, "CACHE_DIR", str(cache / "chosen"))
    assert cpu_kernels._numba_cache_dir() == str(cache / "chosen")
    assert cpu_kernels.compile_expected()


@needs_numba
def test_the_record_is_kept_where_only_its_owner_may_look(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its times are those of a load that came after the data was read: nobody else may
    stat it. A cache that cannot be written keeps neither a record nor a temporary file, and
    one that cannot be searched shows no note rather than failing the run."""
    cpu_kernels.record_compiled()
    folder = cache / "kernels"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for record in folder.iterdir():
        record.unlink()

    def refused(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(records.os, "replace", refused)
        cpu_kernels.record_compiled()
    assert list(folder.iterdir()) == [] and cpu_kernels.compile_expected()

    def unsearchable():
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cpu_kernels, "_compiled_record", unsearchable)
    assert not cpu_kernels.compile_expected()
    cpu_kernels.record_compiled()  # nothing to do, nothing raised


@needs_numba
def test_not_expected_where_the_kernels_do_not_run(cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_kernels.compile_expected()
    monkeypatch.setenv("DPLANG_NO_KERNELS", "1")
    assert not cpu_kernels.compile_expected()
    monkeypatch.delenv("DPLANG_NO_KERNELS")
    monkeypatch.setattr(cpu_kernels, "_DISABLED", True)
    assert not cpu_kernels.compile_expected()


def _statuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The status lines ``dplang generate`` will show (a toy model, a six-line data file at
    ``tmp_path / "d.csv"``), collected in the list returned."""
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(f"review {i} was fine" for i in range(6)) + "\n")
    shown: list[str] = []

    @contextlib.contextmanager
    def status(self, message: str):
        shown.append(message)
        yield

    monkeypatch.setattr(RichDisplay, "status", status)
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32", **kw: ToyModel(vocab_size=30,
                                                                     eos_after=None))
    return shown


def _generate(tmp_path: Path, out: str, *extra: str) -> int:
    return main(["generate", "--data", str(tmp_path / "d.csv"), "--out", str(tmp_path / out),
                 "--epsilon", "3", "-B", "3", "-T", "2", "--device", "cpu", *extra])


@needs_numba
def test_the_first_run_says_so_while_loading_and_the_next_does_not(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _statuses(tmp_path, monkeypatch)
    for run in ("a", "b"):
        assert _generate(tmp_path, f"{run}.jsonl") == 0
    assert [NOTE in message for message in shown] == [True, False]
    assert all(message.startswith("reading the data and loading the model") for message in shown)


@needs_numba
def test_no_note_where_workers_load_the_model(cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--executor local`` this process loads the tokenizer only; the workers compile
    (or read) the kernels in their own processes: no note here, and no record."""
    shown = _statuses(tmp_path, monkeypatch)
    assert _generate(tmp_path, "w.jsonl", "--executor", "local", "--workers", "1",
                     "--dry-run") == 0
    assert shown and not any(NOTE in message for message in shown)
    assert cpu_kernels.compile_expected()
