"""The Python API: each command of the command line as one function call.

=========================  ===============================================================
:func:`generate`           private synthetic texts (``dplang generate``)
:func:`report`             an evidence-bearing private report (``dplang report``)
:func:`sample`             private samples of records (``dplang sample``)
:func:`account`            the InvisibleInk privacy calculation (``dplang account --json``)
=========================  ===============================================================

All are importable from ``dplang`` itself (``dplang.generate(...)``). The command line calls the
same code with its own display, so the privacy rules are the same: the ledger is charged under
the dataset name before the first private computation, the seed is secret unless given, and
every refusal is a :class:`DPLangError` carrying the command line's message (``docs/api.md``).
"""

from __future__ import annotations

from typing import Any

from .errors import DPLangError, Interrupted

__all__ = ["DPLangError", "DPLangWarning", "GenerationResult", "Interrupted", "ReportResult",
           "SampleResult", "account", "generate", "report", "sample"]

_LAZY = {
    "generate": "generation", "GenerationResult": "generation",
    "report": "reporting", "ReportResult": "reporting",
    "sample": "sampling", "SampleResult": "sampling",
    "account": "accounting",
    "DPLangWarning": "display",
}


def __getattr__(name: str) -> Any:  # PEP 562: the heavy modules load on first use
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
