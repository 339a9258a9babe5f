"""``python -m dplang.cli.app`` runs the same entry point as the ``dplang`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dplang
from dplang.cli import app as app_module


def _python_m(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    src = str(Path(dplang.__file__).resolve().parents[1])  # the dplang under test
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dplang.cli.app", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_python_m_runs_the_console_entry_point(tmp_path):
    """One subprocess (importing the app costs ~5 s of CPU): a usage error handled by main() —
    one line, exit 2 — proves the module ran the console entry point, not typer directly."""
    bad = _python_m("formal", "audit", "soft-margin", "--instance", "ipp-pair", "--epsilon", "0",
                    env_extra={"DPLANG_LEDGER": str(tmp_path / "l.sqlite")})
    assert bad.returncode == 2
    assert [ln for ln in bad.stderr.splitlines() if ln.strip()] == [
        "error: --epsilon must be > 0, got 0.0"]
    # the console script ``dplang`` is app:run, which is what the __main__ block calls
    source = Path(app_module.__file__).read_text(encoding="utf-8")
    assert 'if __name__ == "__main__":' in source.split("def run()")[1]
    assert source.rstrip().endswith("run()")
