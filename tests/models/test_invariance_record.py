"""The row-invariance check on record: skipped only for the very configuration that passed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dplang.models import TransformersModel, attention, decoder, records
from dplang.models import invariance as inv
from dplang.models.invariance import RowInvarianceError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(inv.RECHECK_ENV, raising=False)
    return tmp_path / "cache" / "invariance"


def _row_records(cache: Path, pattern: str = "*.json") -> list[Path]:
    """The load-time check's records (not the kernels' admission probes kept beside them)."""
    return [p for p in cache.glob(pattern) if not p.name.startswith("packed-int8-")]


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
    assert calls == [1] and len(_row_records(cache)) == 1
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1]  # the same configuration: on record
    # anything in the numerics is another configuration: checked again, recorded apart
    TransformersModel(tiny_llama_dir, threads=2, block_size=8, check_invariance="cached")
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, dtype="bfloat16",
                      check_invariance="cached")
    assert calls == [1, 1, 1] and len(_row_records(cache)) == 3
    monkeypatch.setenv(inv.RECHECK_ENV, "1")  # forced
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert len(calls) == 4
    # a plain check_invariance=True never reads the record
    monkeypatch.delenv(inv.RECHECK_ENV)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4)
    assert len(calls) == 5


def _passes(cache: Path) -> list[Path]:
    return [p for p in _row_records(cache) if not p.name.endswith(".refused.json")]


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
    monkeypatch.setattr(cpu_kernels, "_DISABLED", cpu_kernels._DISABLED)  # (disable() sets both)
    monkeypatch.setattr(decoder, "attend", _leaky(attention.attend))
    monkeypatch.setattr(cpu_kernels, "attend_tokens", _leaky(cpu_kernels.attend_tokens))
    with pytest.raises(RowInvarianceError, match="reference arithmetic"):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert len(_row_records(cache, "*.refused.json")) == 1 and not _passes(cache)
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
    monkeypatch.setattr(cpu_kernels, "_DISABLED", cpu_kernels._DISABLED)  # (disable() sets both)
    monkeypatch.setattr(cpu_kernels, "attend_tokens", _leaky(cpu_kernels.attend_tokens))
    with pytest.warns(UserWarning, match="reference arithmetic"):
        model = TransformersModel(tiny_llama_dir, threads=2, block_size=4,
                                  check_invariance="cached")
    assert not cpu_kernels.available(torch.zeros(1))
    assert {linear.kernel for linear in model._decoder._linears()} == {"float32"}
    model.check_row_invariance()  # and it is row-invariant
    records = _passes(cache)
    assert len(records) == 1 and '"reference"' in records[0].read_text()


@pytest.mark.parametrize("damaged", [
    "", "{not json", "[]", '"pass"', '{"model_id": "x", "arithmetic": "fast"}',
    '{"verified": "true", "arithmetic": "fast"}', '{"verified": true}',
    '{"verified": true, "arithmetic": "faster"}', '{"verified": true, "arithmetic": null}',
    '{"verified": 1, "arithmetic": "fast"}', '{"verified": 1.0, "arithmetic": "fast"}',
    '{"verified": true, "arithmetic": ["fast"]}', "[" * 100_000])
def test_a_record_that_is_not_a_complete_pass_is_checked_again(
        damaged: str, tiny_llama_dir: Path, cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged, truncated or foreign record never stands for a pass: the check runs again
    and the record is rewritten complete (an unreadable record used to count as a pass with
    the fast arithmetic, even where the pass on record had needed the reference one)."""
    calls = _calls(monkeypatch)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    (record,) = _passes(cache)
    record.write_text(damaged)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1, 1]
    assert records.read_json(record).get("verified") is True
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1, 1]  # the rewritten record is a pass


def test_a_damaged_reference_record_does_not_grant_the_fast_arithmetic(
        tiny_llama_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dplang.models import cpu_kernels

    if not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("numba is not installed: there is no fast path to fall back from")
    numba = cpu_kernels._NUMBA
    monkeypatch.setattr(cpu_kernels, "_NUMBA", numba)  # restored afterwards
    monkeypatch.setattr(cpu_kernels, "_DISABLED", False)
    monkeypatch.setattr(cpu_kernels, "attend_tokens", _leaky(cpu_kernels.attend_tokens))
    with pytest.warns(UserWarning, match="reference arithmetic"):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    (record,) = _passes(cache)
    record.write_text(record.read_text()[:-3])  # truncated, e.g. by a full disk
    cpu_kernels._NUMBA, cpu_kernels._DISABLED = numba, False  # the next process: fast path on
    assert cpu_kernels.available(torch.zeros(1))
    with pytest.warns(UserWarning, match="reference arithmetic"):  # checked again: refused
        model = TransformersModel(tiny_llama_dir, threads=2, block_size=4,
                                  check_invariance="cached")
    assert {linear.kernel for linear in model._decoder._linears()} == {"float32"}
    assert '"reference"' in record.read_text()


def test_the_key_covers_weights_and_backend_source(tiny_llama_dir: Path, cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance=False)
    key = inv._record_key(model)
    monkeypatch.setattr(model, "_digest", "0" * 64)
    assert inv._record_key(model) != key
    monkeypatch.setattr(model, "_digest", None)
    assert inv._record_key(model) == key
    monkeypatch.setattr(records, "_ARITHMETIC_ROOTS", ("dplang.models.errors",))
    monkeypatch.setattr(records, "_MODULES", {})  # the derivation runs again (another process)
    monkeypatch.setattr(records, "_DIGESTS", {})
    assert inv._record_key(model) != key


def test_a_changed_kernel_module_is_checked_again(tiny_llama_dir: Path, cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 §1: the record was keyed on seven hand-listed modules, not the fused kernels
    that compute most of the CPU bits. A kernel made row-dependent (here: its source read
    back changed, as a copy with one level fewer for rows >= 3 would be) must not find the
    earlier pass on record."""
    calls = _calls(monkeypatch)
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1]
    kernels = Path(records.__file__).with_name("_numba_kernels.py").resolve()
    real_read = Path.read_bytes

    def edited(self: Path) -> bytes:
        data = real_read(self)
        if self.resolve() == kernels:
            data += b"\n# quantize_limbs: one level fewer when rows >= 3\n"
        return data

    monkeypatch.setattr(Path, "read_bytes", edited)
    monkeypatch.setattr(records, "_DIGESTS", {})  # as another process reading the edited file
    TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance="cached")
    assert calls == [1, 1]


@pytest.mark.parametrize("change", ["numba version", "triton installed", "threads",
                                    "kernels off", "ISA variable"])
def test_what_chooses_the_kernels_is_in_the_key(change: str, tiny_llama_dir: Path, cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    model = TransformersModel(tiny_llama_dir, threads=2, block_size=4, check_invariance=False)
    key = inv._record_key(model)
    real_version = metadata.version
    monkeypatch.setattr(records, "_VERSIONS", {})  # as another process would read them
    if change == "numba version":
        monkeypatch.setattr(metadata, "version", lambda name: "0.0.1" if name == "numba"
                            else real_version(name))
    elif change == "triton installed":
        monkeypatch.setattr(metadata, "version", lambda name: "9.9" if name == "triton"
                            else real_version(name))
    elif change == "threads":
        monkeypatch.setattr(model, "threads", 1)
        torch.set_num_threads(1)
    elif change == "kernels off":
        from dplang.models import cpu_kernels

        monkeypatch.setattr(cpu_kernels, "_NUMBA", not cpu_kernels._load())
    else:  # another value than this (perhaps simulated) machine's
        other = "default" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "avx2"
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", other)
    try:
        assert inv._record_key(model) != key
    finally:
        torch.set_num_threads(2)


def test_every_module_the_decoder_runs_is_in_the_key(tiny_gemma_dir: Path) -> None:
    """The list is derived from the imports; this checks it against what a real load and
    decode imports (in a fresh process): a module of dplang.models the decoder runs that the
    key does not cover fails here."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from dplang.models import TransformersModel\n"
            "from dplang.models.invariance import arithmetic_modules\n"
            f"m = TransformersModel({str(tiny_gemma_dir)!r}, check_invariance=True)\n"
            "s = m.encode_prompts(['a b c', 'd'])\n"
            "m.logits_from_hidden(m.next_hidden(s, None))\n"
            "m.logits_from_hidden(m.next_hidden(s, torch.tensor([1, 2])))\n"
            "keyed = {str(p.resolve()) for p in arithmetic_modules()}\n"
            "used = {str(__import__('pathlib').Path(mod.__file__).resolve())\n"
            "        for name, mod in list(sys.modules.items())\n"
            "        if name.startswith('dplang.models') and getattr(mod, '__file__', None)}\n"
            "print('MISSING', sorted(used - keyed))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MISSING []" in done.stdout, done.stdout
    names = {p.name for p in inv.arithmetic_modules()}
    assert {"_numba_kernels.py", "cpu_kernels.py", "exact.py", "attention.py", "decoder.py",
            "vml.py"} <= names


def test_a_refusal_is_found_by_the_next_process_before_any_load(tiny_llama_dir: Path,
                                                                tmp_path: Path) -> None:
    """The refusal's key must not depend on what a refused check changed in its own process
    (the fused kernels switched off, numba's cache folder set): another process finds it
    before it loads a weight."""
    import os
    import subprocess
    import sys

    child = ("import sys\n"
             "import dplang.models.invariance as inv\n"
             "from dplang.models import resolve_model\n"
             "from dplang.models.default import check_refusal_on_record\n"
             "from dplang.models.errors import RowInvarianceError\n"
             "try:\n"
             "    check_refusal_on_record(sys.argv[1])\n"
             "    print('NOT ON RECORD')\n"
             "except RowInvarianceError:\n"
             "    print('ON RECORD')\n"
             "if sys.argv[2] == 'fail':\n"
             "    def refuse(model):\n"
             "        raise RowInvarianceError('simulated: rows differ')\n"
             "    inv.check_row_invariance = refuse\n"
             "    try:\n"
             "        resolve_model(sys.argv[1], threads=2)\n"
             "    except RowInvarianceError:\n"
             "        print('REFUSED')\n")
    from dplang.models import cpu_kernels

    env = {**os.environ, "DPLANG_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(inv.RECHECK_ENV, None)
    env.pop("NUMBA_CACHE_DIR", None)
    # the children set NUMBA_CACHE_DIR themselves, to the fresh cache's numba/ folder; a link
    # there to this process's compiled kernels spares them a compilation (most of a minute)
    compiled = Path(cpu_kernels._numba_cache_dir())
    if compiled.is_dir():
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "numba").symlink_to(compiled, target_is_directory=True)
    outs = [subprocess.run([sys.executable, "-c", child, str(tiny_llama_dir), mode],
                           capture_output=True, text=True, env=env, timeout=600)
            for mode in ("fail", "check")]
    assert "NOT ON RECORD" in outs[0].stdout and "REFUSED" in outs[0].stdout, outs[0].stderr
    assert "ON RECORD" in outs[1].stdout.replace("NOT ON RECORD", ""), outs[1]


def test_the_statement_walk_finds_every_import_ast_walk_finds() -> None:
    """The arithmetic's modules are derived from import statements found by walking
    statement lists only; on every module of dplang (and a made-up one with imports at every
    depth) it finds exactly what a walk of every node finds."""
    import ast

    made_up = ("import a\nif x:\n    import b\nelse:\n    from c import d\n"
               "try:\n    import e\nexcept E:\n    import f\nelse:\n    import g\n"
               "finally:\n    import h\nclass K:\n    def m(self):\n        with w:\n"
               "            for i in j:\n                while k:\n                    import l\n"
               "match v:\n    case 1:\n        import m\nasync def n():\n    async with o:\n"
               "        import p\n")
    sources = [made_up] + [p.read_text() for p in
                           Path(records.__file__).resolve().parents[1].rglob("*.py")]
    for source in sources:
        tree = ast.parse(source)
        every = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert sorted(map(id, records.import_statements(tree))) == sorted(map(id, every))
    assert len(records.import_statements(ast.parse(made_up))) == 10


def test_a_record_that_is_not_a_regular_file_counts_as_none(tmp_path: Path) -> None:
    """A FIFO at a record's path would block the read forever; a folder cannot be read."""
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert records.read_json(fifo) == {}
    (tmp_path / "folder.json").mkdir()
    assert records.read_json(tmp_path / "folder.json") == {}
