"""The run lock with real processes: two ``dplang generate`` processes on one
``--out`` never both write it, and a lock left by ``kill -9`` does not block the next run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dplang.release import OutputPaths, RunLock, RunLocked

#: Runs ``dplang`` with the toy model whose decode steps wait until the file ``argv[1]``
#: exists ("-": no waiting), so that the test decides when a run may go on.
RUNNER = textwrap.dedent("""
    import os, sys, time
    import dplang.cli.generate as gen_cli
    from dplang.cli.app import main
    from dplang.models import ToyModel

    class Gated(ToyModel):
        def next_hidden(self, state, tokens):
            while sys.argv[1] != "-" and not os.path.exists(sys.argv[1]):
                time.sleep(0.02)
            return super().next_hidden(state, tokens)

    model = Gated(vocab_size=30, eos_after=None)
    gen_cli._load_model = lambda spec, dtype="float32": model
    sys.exit(main(sys.argv[2:]))
""")


def _env(tmp: Path) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "DPLANG_LEDGER": str(tmp / "ledger.sqlite")}


def _start(tmp: Path, out: Path, gate: str) -> subprocess.Popen[str]:
    data = tmp / "d.csv"
    if not data.exists():
        data.write_text("text\n" + "\n".join(f"review {i} was fine" for i in range(12)) + "\n")
        (tmp / "runner.py").write_text(RUNNER)
    args = [sys.executable, str(tmp / "runner.py"), gate, "generate", "--data", str(data),
            "--out", str(out), "--epsilon", "3", "-B", "3", "-T", "12", "-G", "1",
            "--seed", "5", "-q"]
    return subprocess.Popen(args, env=_env(tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    start = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the first process ended first: {proc.communicate()}")
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


def _groups(out: Path) -> list[int]:
    return sorted(json.loads(line)["group"] for line in out.read_text().splitlines())


def test_a_second_process_is_refused_while_the_first_writes(tmp_path):
    out = tmp_path / "runs" / "x.jsonl"
    gate = tmp_path / "go"
    first = _start(tmp_path, out, str(gate))
    try:
        _wait_for(OutputPaths.of(out).partial, first)  # holds the lock, opened its output, waits
        second = _start(tmp_path, out, "-")
        _stdout, err = second.communicate(timeout=300)
        assert second.returncode == 2, err
        assert err.startswith("error: ") and err.count("\n") == 1
        assert "being written by another dplang process" in err and "Traceback" not in err
        assert f"pid {first.pid}" in err
    finally:
        gate.write_text("go")
        _stdout, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert _groups(out) == [0, 1, 2, 3]  # every group once
    assert not OutputPaths.of(out).lock.exists()


def test_a_lock_left_by_kill_9_is_harmless(tmp_path):
    out = tmp_path / "x.jsonl"
    first = _start(tmp_path, out, str(tmp_path / "never"))
    _wait_for(OutputPaths.of(out).partial, first)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert OutputPaths.of(out).lock.exists()  # left behind, but nobody holds it
    again = _start(tmp_path, out, "-")
    _stdout, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert _groups(out) == [0, 1, 2, 3]  # resumed after the finished groups, none twice
    assert not OutputPaths.of(out).lock.exists()


def test_lock_is_reentrant_in_process_and_exclusive_across(tmp_path):
    out = tmp_path / "new" / "deeper" / "x.jsonl"
    with RunLock(out):
        with RunLock(out):  # the CLI and the library both take it
            assert OutputPaths.of(out).lock.exists()
        assert OutputPaths.of(out).lock.exists()
        code = ("import sys; from dplang.release import RunLock, RunLocked\n"
                "try:\n RunLock(sys.argv[1]).acquire()\nexcept RunLocked as e:\n"
                " print(e); sys.exit(7)\n")
        other = subprocess.run([sys.executable, "-c", code, str(out)], env=_env(tmp_path),
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 7 and "another dplang process" in other.stdout
    # released: the lock file and the folders it had to create are gone
    assert not (tmp_path / "new").exists()
    with pytest.raises(RunLocked), RunLock(out):
        raise RunLocked("raised inside: the lock is still released")
    assert not (tmp_path / "new").exists()
