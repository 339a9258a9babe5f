"""Language models behind one small protocol (:class:`LogitsModel`).

``import dplang.models`` is cheap (no PyTorch): every name below is imported on first use, so
that ``dplang.models.errors`` can be read by the command line without loading the backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dplang.models.base import DecodeState, LogitsModel
    from dplang.models.default import load_default_model, resolve_model, resolve_prompt_side
    from dplang.models.prompt_side import PromptSide
    from dplang.models.toy import ToyModel, make_tiny_hf_model
    from dplang.models.transformers import TransformersModel

__all__ = [
    "DecodeState",
    "LogitsModel",
    "PromptSide",
    "ToyModel",
    "TransformersModel",
    "load_default_model",
    "make_tiny_hf_model",
    "resolve_model",
    "resolve_prompt_side",
]

_LAZY = {
    "DecodeState": "dplang.models.base",
    "LogitsModel": "dplang.models.base",
    "ToyModel": "dplang.models.toy",
    "make_tiny_hf_model": "dplang.models.toy",
    "TransformersModel": "dplang.models.transformers",
    "load_default_model": "dplang.models.default",
    "resolve_model": "dplang.models.default",
    "resolve_prompt_side": "dplang.models.default",
    "PromptSide": "dplang.models.prompt_side",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dplang.models' has no attribute {name!r}")
