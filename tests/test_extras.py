"""A command that needs a missing optional extra says which and how to install it (issue 35
§2: `dplang evaluate` after `make demo` died on 'No module named threadpoolctl')."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dplang.cli.app import main
from dplang.extras import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for extra, requirements in project["optional-dependencies"].items():
        out[extra] = {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}
    return out


def test_the_table_matches_pyproject():
    extras = _extras()
    for module, (dist, extra) in EXTRA_OF_MODULE.items():
        assert dist.lower() in extras[extra], (module, dist, extra)
    listed = {(d.lower(), e) for d, e in EXTRA_OF_MODULE.values()}
    for extra, dists in extras.items():
        if extra == "test":
            continue
        assert {(d, extra) for d in dists} <= listed, (extra, dists)


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch, capsys, tmp_path):
    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'threadpoolctl'", name="threadpoolctl")

    real = tmp_path / "real.csv"
    real.write_text("text\n" + "".join(f"real text {i}\n" for i in range(5)))
    synthetic = tmp_path / "s.jsonl"
    synthetic.write_text("")
    import dplang.evaluation as evaluation

    monkeypatch.setattr(evaluation, "evaluate_files", missing)
    code = main(["evaluate", "--real", str(real), "--synthetic", str(synthetic),
                 "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "dplang evaluate needs dplang's 'eval' extra" in err
    assert "pip install 'dplang[eval]'" in err and "a bug" not in err
