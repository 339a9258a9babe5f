"""Shared fixtures: tiny Hugging Face models written locally (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dplang.models.toy import make_tiny_hf_model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-architecture model without a chat template."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 model: sliding window 4, soft-capped logits, a chat template."""
    return make_tiny_hf_model(
        tmp_path_factory.mktemp("tiny_gemma"),
        arch="gemma3",
        chat_template=True,
        sliding_window=4,
        final_logit_softcapping=3.0,
    )
