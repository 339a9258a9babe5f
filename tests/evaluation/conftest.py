"""Fixtures for the evaluation tests: small corpora written here, a tiny local HF model, the
offline default embedder (loaded once per session). Nothing is downloaded."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dplang.models.toy import make_tiny_hf_model

_SUBJECTS = [
    "The pasta", "Our waiter", "The hotel room", "The coffee", "This dentist", "The pizza",
    "The bartender", "The museum tour", "The haircut", "The grocery store", "The sushi",
    "The front desk staff", "The concert", "The bakery", "The burger", "The spa massage",
]
_VERBS = ["was", "seemed", "felt", "turned out to be", "is always"]
_ADJECTIVES = [
    "wonderful", "terrible", "overpriced", "friendly", "cold", "delicious", "slow", "clean",
    "noisy", "relaxing", "disappointing", "fantastic", "rude", "cozy", "bland", "excellent",
]
_ENDINGS = [
    "and I would come back.", "so we left early.", "but the parking was a nightmare.",
    "and the prices were fair.", "and my kids loved it.", "which ruined our evening.",
    "so I gave it five stars.", "but the music was too loud.", "and the staff apologised.",
    "even on a busy Saturday night.", "compared to last year.", "for a quick lunch.",
]


def make_reviews(n: int, seed: int = 0) -> list[str]:
    """``n`` short, varied review-like texts (deterministic)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        first = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_ADJECTIVES)} "
                 f"{rng.choice(_ENDINGS)}")
        second = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_ADJECTIVES)}."
        out.append(first + (" " + second if rng.random() < 0.5 else ""))
    return out


def make_degenerate(n: int) -> list[str]:
    """``n`` copies of one repetitive text (a collapsed generator)."""
    return ["the the the the the the the the the the"] * n


def write_real_csv(path: Path, texts: list[str], blank_at: tuple[int, ...] = ()) -> Path:
    """A CSV with columns ``text,label``; rows in ``blank_at`` get an empty text."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for i, text in enumerate(texts):
            writer.writerow(["" if i in blank_at else text, f"L{i % 3}"])
    return path


def write_synthetic(
    path: Path,
    texts: list[str],
    *,
    manifest: dict[str, Any] | None = None,
    reference_ids: Callable[[int], list[int]] | None = None,
    order: list[int] | None = None,
) -> Path:
    """A ``dplang generate``-style JSONL (and manifest, unless ``manifest`` is ``{}``)."""
    order = list(range(len(texts))) if order is None else order
    with open(path, "w", encoding="utf-8") as fh:
        for i in order:
            text = texts[i]
            record = {
                "group": i,
                "text": text,
                "num_tokens": len(text.split()),
                "stopped": "eos",
                "reference_ids": reference_ids(i) if reference_ids else [1000 + i],
                "labels": {},
                "topk_plus_mean": 50.0 + (i % 3),
                "topk_plus_std": 0.5,
                "expansion_tokens": i % 4,
                "token_ids": [],
            }
            fh.write(json.dumps(record) + "\n")
    if manifest is None:
        manifest = {
            "epsilon": 10.0, "delta": 1e-6, "rho": 1.54, "clip": 0.66,
            "fingerprint": {"parameters": {"top_k": 50, "batch_size": 7, "max_tokens": 64,
                                           "temperature": 1.2, "model": "default",
                                           "data": "/nonexistent/train.csv"}},
            "data": {"path": "/nonexistent/train.csv", "sha256": "0" * 64},
        }
    if manifest:
        stem = path.name.removesuffix(".jsonl")
        path.with_name(stem + ".manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture(autouse=True)
def _offline():
    """Never reach the Hugging Face hub (its own MonkeyPatch: a test's ``monkeypatch.undo()``
    does not undo it)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield
    patch.undo()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama-architecture causal LM with a locally trained tokenizer."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 model (sliding window, soft-capped logits)."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_gemma"), arch="gemma3",
                              sliding_window=4, final_logit_softcapping=3.0)


@pytest.fixture(scope="session")
def default_embedder() -> Any:
    """The real offline default embedder (all-MiniLM-L6-v2), loaded once."""
    from dplang.evaluation import resolve_embedder

    embedder = resolve_embedder("default")
    embedder.embed(["warm up"])
    return embedder


@pytest.fixture(scope="session")
def kit() -> Any:
    """The helpers above, for test modules (conftest modules are not importable by name
    under ``--import-mode=importlib``)."""
    from types import SimpleNamespace

    return SimpleNamespace(reviews=make_reviews, degenerate=make_degenerate,
                           write_real_csv=write_real_csv, write_synthetic=write_synthetic)
