"""Errors of the model backends that commands report as one line with exit code 2 (no torch
import here, so the command line can name them without loading PyTorch)."""

from __future__ import annotations

__all__ = ["ModelConfigurationError", "RowInvarianceError", "UnsupportedModelError",
           "load_failure_message"]


class ModelConfigurationError(RuntimeError):
    """A model that cannot be used as configured (reported as ``error: ...``, exit 2)."""


class RowInvarianceError(ModelConfigurationError):
    """This model configuration does not give bit-identical per-row results on this machine."""


class UnsupportedModelError(ModelConfigurationError, NotImplementedError):
    """An architecture, activation, norm or rotary embedding dplang's exact decoder does not
    implement (its row invariance could not be argued)."""


def load_failure_message(flag: str, spec: str, exc: BaseException) -> str:
    """The one-line error for a model given as ``flag spec`` that could not be loaded.

    The embedded default model (``spec == "default"``) is built to pass every load-time check
    on every machine: its failure is reported as a defect to report, never as a model dplang
    does not support; any other model's refusal names what differs (the exception's text)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = type(exc).__name__ + (f": {first}" if first else "")
    if spec == "default":
        return (f"{flag} default: the embedded default model failed a load-time check it is "
                f"built to pass ({what}); this is a defect of dplang or of this installation, "
                "not of your data or flags: please report it with the output of "
                "`dplang --version`")
    return f"{flag} {spec}: cannot load it ({what})"
