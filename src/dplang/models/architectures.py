"""The architectures dplang's exact decoder reproduces (no torch import: the command line's
milliseconds checks of ``--model`` read this)."""

from __future__ import annotations

__all__ = ["SUPPORTED_MODEL_TYPES"]

#: ``config.model_type`` values whose forward pass :class:`~dplang.models.decoder.ExactDecoder`
#: reproduces.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                         "gemma3")
