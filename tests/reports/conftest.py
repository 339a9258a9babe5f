"""Fixtures for the report tests: tiny local judge models (nothing is downloaded)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dplang.models.toy import make_tiny_hf_model


@pytest.fixture(scope="session")
def tiny_causal_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama causal LM with its tokenizer."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_lm"), arch="llama")


@pytest.fixture(scope="session")
def tiny_nli(tmp_path_factory: pytest.TempPathFactory, tiny_causal_lm: Path) -> Path:
    """A tiny random sequence-classification model with NLI labels (and the same tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny_nli")
    for item in tiny_causal_lm.iterdir():
        if "token" in item.name or item.name == "special_tokens_map.json":
            shutil.copy(item, folder / item.name)
    base = LlamaConfig.from_pretrained(tiny_causal_lm)
    config = LlamaConfig(
        vocab_size=base.vocab_size, hidden_size=32, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        pad_token_id=base.pad_token_id, bos_token_id=base.bos_token_id,
        eos_token_id=base.eos_token_id, initializer_range=0.5, num_labels=3,
        id2label={0: "contradiction", 1: "entailment", 2: "neutral"},
        label2id={"contradiction": 0, "entailment": 1, "neutral": 2},
    )
    torch.manual_seed(1)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(folder)
    return folder
