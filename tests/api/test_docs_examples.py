"""Every Python example of the README and of docs/api.md runs as written: the
README's on a fresh interpreter state each, docs/api.md's in order in one namespace (the page
reads as one notebook session). They load the embedded default model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path, section: str | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if section is not None:
        start = text.index(f"## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_examples_are_found():
    assert len(python_blocks(ROOT / "README.md", "From Python")) == 1
    assert len(python_blocks(ROOT / "docs" / "api.md")) == 5


@pytest.mark.model
def test_readme_from_python_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    [block] = python_blocks(ROOT / "README.md", "From Python")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert len(result.texts) == 1 and result.texts[0].strip()
    assert result.guarantee.epsilon == pytest.approx(10)
    assert "zero-concentrated differential privacy" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing written (the ledger is elsewhere)


def test_readme_library_example_runs():
    [block] = python_blocks(ROOT / "README.md", "Library")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["clip"] == pytest.approx(0.6591, abs=1e-4)


@pytest.mark.model
def test_api_page_runs_as_one_session(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in python_blocks(ROOT / "docs" / "api.md"):
        exec(compile(block, "docs/api.md", "exec"), namespace)
    assert len(namespace["result"].texts) == 2
    # groups in the order their labels first occur in the data
    assert namespace["by_stars"].labels == [{"stars": "5"}, {"stars": "2"}]
    assert {c.decision for c in namespace["found"].certificates} <= {"emit", "abstain"}
    assert len(namespace["drawn"].samples) == 2
    assert namespace["budget"]["clip"] > 0
    assert not list(tmp_path.iterdir())
