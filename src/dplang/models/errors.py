"""Errors of the model backends that commands report as one line with exit code 2 (no torch
import here, so the command line can name them without loading PyTorch)."""

from __future__ import annotations

__all__ = ["ModelConfigurationError", "RowInvarianceError", "UnsupportedModelError"]


class ModelConfigurationError(RuntimeError):
    """A model that cannot be used as configured (reported as ``error: ...``, exit 2)."""


class RowInvarianceError(ModelConfigurationError):
    """This model configuration does not give bit-identical per-row results on this machine."""


class UnsupportedModelError(ModelConfigurationError, NotImplementedError):
    """An architecture, activation, norm or rotary embedding dplang's exact decoder does not
    implement (its row invariance could not be argued)."""
