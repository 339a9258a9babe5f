"""Which device a model runs on (``--device cpu|cuda|auto``); no model code here.

The device *type* is part of a run's identity (it is in the model's ``numerics``, hence in the
public fingerprint): the same seed and parameters on another device type may round otherwise,
so they are another release, charged anew. Which GPU, and how many workers, are not.
"""

from __future__ import annotations

__all__ = ["DEVICES", "DeviceError", "cuda_available", "index_tensor", "resolve_device"]

#: Accepted ``--device`` values.
DEVICES = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """A ``--device`` that cannot be used here (one-line message)."""


def cuda_available() -> bool:
    """Whether PyTorch sees a usable CUDA GPU (imports torch: only for ``auto``/``cuda``)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install raises rather than answering False
        return False


def resolve_device(name: str) -> str:
    """``"cpu"`` or ``"cuda"`` for a ``--device`` value: ``auto`` is ``cuda`` when
    :func:`cuda_available`, else ``cpu``. ``cuda`` without a GPU raises :class:`DeviceError`
    (milliseconds: checked before anything is read or charged)."""
    if name not in DEVICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if name == "cuda" and not cuda_available():
        raise DeviceError("--device cuda: no CUDA GPU is available here "
                          "(torch.cuda.is_available() is False); use --device cpu or auto")
    return name


def index_tensor(values: list[int], device: object) -> object:
    """int64 ``values`` on ``device`` without waiting for it: on a GPU through pinned host
    memory and a non-blocking copy (an ordinary copy of host memory waits for every queued
    kernel first: one synchronisation per index); on the CPU an ordinary tensor."""
    import torch

    host = torch.tensor(values, dtype=torch.int64)
    target = torch.device(device)  # type: ignore[arg-type]
    if target.type != "cuda":
        return host
    return host.pin_memory().to(target, non_blocking=True)
