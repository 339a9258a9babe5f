"""Heavy libraries imported on first use, so that ``dplang --help`` answers in well under a
second: a module that only declares what it offers (a method's options, a command's
flags) must not pay for torch or scipy until it computes something."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule(types.ModuleType):
    """Stands for a module until an attribute is read; then every read is the real module's."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_target"] = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__dict__["_lazy_target"])
        return getattr(module, attr)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__dict__["_lazy_target"]))


def lazy_module(name: str) -> Any:
    """``name`` itself when it is already imported, else a stand-in that imports it on the
    first attribute read (``torch = lazy_module("torch")``; ``torch.tensor(...)`` imports)."""
    return sys.modules.get(name) or _LazyModule(name)
