"""Cache handling of the default model, without loading it (fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dplang.models import default as default_module


def test_cache_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path))
    assert default_module.cache_dir() == tmp_path
    folder = default_module.default_model_dir()
    assert folder.parent == tmp_path / "models" and folder.name.startswith("gemma-3-270m")
    monkeypatch.delenv("DPLANG_CACHE_DIR")
    assert default_module.cache_dir().name == "dplang"


def test_failed_conversion_leaves_no_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path))

    def crash(target: Path) -> None:
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(default_module, "_convert", crash)
    with pytest.raises(RuntimeError):
        default_module.ensure_default_model()
    models = tmp_path / "models"
    assert list(models.iterdir()) == []  # neither the folder nor the staging area remains


def test_atomic_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(target: Path) -> None:
        calls.append(target)
        target.mkdir(parents=True)
        sha = default_module._expected_sha256()
        (target / default_module._MARKER).write_text(f'{{"gguf_sha256": "{sha}"}}')

    monkeypatch.setattr(default_module, "_convert", fake)
    folder = default_module.ensure_default_model()
    assert folder == default_module.default_model_dir() and default_module._is_complete(folder)
    assert default_module.ensure_default_model() == folder
    assert len(calls) == 1
    assert [p.name for p in (tmp_path / "models").iterdir()] == [folder.name]
