"""The error every generation check raises: one line, before anything is written."""

from __future__ import annotations


class GenerationError(ValueError):
    """A user error detected before anything was written (one-line message)."""
