"""experiments/metric_resolution.py, the check of what each metric can tell apart on real
data, on a toy file: offline (the hashing embedder, no tokenizer), small n, few resamples."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = ["Business Category: Restaurants", "Business Category: Bars"]


@pytest.fixture
def resolution(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "metric_resolution", REPO / "experiments" / "metric_resolution.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "metric_resolution", module)  # for its dataclasses
    spec.loader.exec_module(module)
    return module


def _yelp_like(path: Path, rows: int = 200) -> Path:
    lines = ["text,label1,label2"]
    for i in range(rows):
        place = "the pizza place" if i % 2 else "the bar"
        mood = "great food and friendly staff" if i % 5 == 4 else "meh and slow service"
        lines.append(f"review {i} of {place}: {mood},{CATEGORIES[i % 2]},"
                     f"Review Stars: {1 + i % 5}.0")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_case_is_scored_and_the_separation_table_printed(resolution, tmp_path, capsys):
    data = _yelp_like(tmp_path / "d.csv")
    out = tmp_path / "r.json"
    code = resolution.main([
        "--data", str(data), "--n", "20", "--embedder", "hashing", "--mauve-bootstrap", "2",
        "--resamples", "20", "--truncate-tokens", "0", "--real-rows", "100:140",
        "--second-rows", "140:180", "--test-rows", "180:200", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| real vs real |" in printed and "Separated from real vs real" in printed
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"real vs real", "5-star only", "Restaurants only"}
    assert result["kinds"]["real vs real"] == "ceiling"
    five = result["results"]["5-star only"]
    # a set of 5-star reviews only: stars TVD 1 − 0.2 against a uniform star mix
    assert five["labels:label2"]["value"] == pytest.approx(0.8)
    assert result["results"]["Restaurants only"]["labels:label1"]["value"] == pytest.approx(0.5)
    for case in result["results"].values():
        assert set(case) >= {"mauve", "classifier", "labels:label1", "labels:label2",
                             "downstream:label1", "macro_f1:label2"}
        assert case["classifier"]["low"] <= case["classifier"]["high"]
    # statistics of held-out rows: never readable by others
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_separated_means_disjoint_intervals(resolution):
    ceiling = {"value": 0.5, "low": 0.45, "high": 0.55}
    assert resolution.separated({"value": 0.6, "low": 0.56, "high": 0.64}, ceiling) == "yes"
    assert resolution.separated({"value": 0.4, "low": 0.3, "high": 0.44}, ceiling) == "yes"
    assert resolution.separated({"value": 0.6, "low": 0.55, "high": 0.64}, ceiling) == "no"
    assert resolution.separated(None, ceiling) == "–"


def test_too_few_qualifying_rows_is_refused(resolution, tmp_path):
    data = _yelp_like(tmp_path / "d.csv", rows=60)
    with pytest.raises(SystemExit, match="5-star only: only"):
        resolution.main(["--data", str(data), "--n", "20", "--embedder", "hashing",
                         "--metrics", "labels", "--truncate-tokens", "0",
                         "--real-rows", "0:20", "--second-rows", "20:40",
                         "--test-rows", "40:60"])


def test_overlapping_row_ranges_are_refused(resolution, tmp_path, capsys):
    """A real-vs-real set sharing rows with A would make the ceiling look tighter than it is."""
    data = _yelp_like(tmp_path / "d.csv", rows=60)
    with pytest.raises(SystemExit):
        resolution.main(["--data", str(data), "--n", "20", "--real-rows", "0:30",
                         "--second-rows", "20:50", "--metrics", "labels"])
    assert "--real-rows and --second-rows overlap" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the test rows count only where downstream is scored
        resolution.main(["--data", str(data), "--n", "20", "--real-rows", "0:20",
                         "--second-rows", "20:40", "--test-rows", "30:60"])
    assert "--second-rows and --test-rows overlap" in capsys.readouterr().err
