"""The load-time check that a backend configuration is row-invariant (privacy-critical).

Every row's logits must be a function of that row's own tokens, bit for bit; the transformers
backend achieves it by construction (:mod:`dplang.models.exact`, :mod:`dplang.models.decoder`;
docs/privacy.md). This module verifies it on the machine and configuration at hand, as the last
line of defence: the backend runs it at load and refuses a configuration where it fails.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from dplang.models.base import DecodeState
from dplang.models.errors import RowInvarianceError
from dplang.models.records import (
    RECHECK_ENV,
    arithmetic_modules,
    arithmetic_source_digest,
    cpu_identity,
    file_stamps,
    kernel_environment,
    package_versions,
    read_json,
    recheck_requested,
    record_folder,
    write_json,
)
from dplang.models.row_state import RowDecodeState

#: The arithmetics a row-invariance record may name: the check passed with the backend's fast
#: paths, or only with its reference arithmetic (which the model must then use).
RECORDED_ARITHMETICS = ("fast", "reference")

__all__ = [
    "RowInvarianceError",
    "arithmetic_modules",
    "bitwise_equal",
    "check_row_invariance",
    "check_row_invariance_cached",
    "is_checked",
    "mark_checked",
]


class CheckedModel(Protocol):
    """What the check uses of :class:`dplang.models.transformers.TransformersModel` (which
    imports this module: it is named here by its shape, not imported)."""

    model_id: str
    config: Any
    dtype: torch.dtype
    threads: int
    block_size: int
    vocab_size: int

    @property
    def numerics(self) -> dict[str, Any]: ...

    def weights_digest(self) -> str: ...

    def refusal_key(self) -> str | None: ...

    def use_reference_arithmetic(self) -> None: ...

    def _prompt_ids(self, prompt: str) -> list[int]: ...

    def add_prompts(self, state: DecodeState, prompts: Sequence[str],
                    prefixes: Sequence[str | None] | None = None) -> None: ...

    def next_hidden(self, state: DecodeState, tokens: torch.Tensor | None) -> torch.Tensor: ...

    def logits_from_hidden(self, hidden: torch.Tensor, candidates: torch.Tensor | None = None,
                           keep_device: bool = False) -> torch.Tensor: ...

    def drop_rows(self, state: DecodeState, keep: torch.Tensor) -> DecodeState: ...




def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (``-0.0`` and ``0.0`` differ, NaNs with the same bits are equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
    kind = as_int.get(a.dtype)
    if kind is None:
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.contiguous().view(kind), b.contiguous().view(kind)))


def check_row_invariance(model: CheckedModel) -> None:
    """Verify, on this machine and configuration, that rows decoded together give exactly
    the bits they give alone: prompts of several lengths (crossing cache blocks), decoded
    together, alone, in another order beside a duplicate, and after a row is dropped;
    hidden states, full-vocabulary logits and candidate logits are compared bit for bit.

    Raises :class:`RowInvarianceError` (the configuration must not be used for private
    generation) on any difference."""
    block = model.block_size
    base = model._prompt_ids("Row invariance probe: the quick brown fox jumps over the lazy "
                            "dog while five boxing wizards jump quickly.")
    # A one-token prompt, one that fills its first block on the first decode step and
    # crosses into a second on the next, and one that starts in its second block.
    lengths = [1, max(1, block - 1), block + 2]
    prompts = [(base * (n // len(base) + 1))[:n] for n in lengths]
    steps = 2
    tokens = [[(31 * s + 7 * r + 11) % model.vocab_size for r in range(len(prompts))]
              for s in range(steps)]
    candidates = torch.tensor([sorted({(97 * j + 5) % model.vocab_size for j in range(41)})])

    def decode(rows: list[int], drop_after: int | None = None) -> list[list[torch.Tensor]]:
        """Per slot of ``rows``: hidden, dense and sparse logits at every step it lived."""
        state = _state(prompts=[prompts[r] for r in rows])
        live = list(range(len(rows)))
        seen: list[list[torch.Tensor]] = [[] for _ in rows]
        for s in range(steps + 1):
            step_tokens = None if s == 0 else torch.tensor(
                [tokens[s - 1][rows[i]] for i in live], dtype=torch.int64)
            hidden = model.next_hidden(state, step_tokens)
            sparse = model.logits_from_hidden(hidden, candidates.expand(len(live), -1))
            values = [hidden, sparse]
            if s == steps:  # the full head costs most: once per run
                values.append(model.logits_from_hidden(hidden))
            for j, i in enumerate(live):
                seen[i].extend(v[j] for v in values)
            if drop_after is not None and s == drop_after:
                # The dropped row's slot is filled with huge values before it is freed:
                # whoever gets it next must not see its old values.
                dropped = state.caches[0]
                assert state.cache is not None and dropped is not None
                state.cache.poison(dropped.slot)
                model.drop_rows(state, torch.arange(1, len(live)))
                live = live[1:]
        return seen

    everyone = list(range(len(prompts)))
    alone = {r: decode([r])[0] for r in everyone}
    runs = {"together": everyone, "reordered": [2, 0, 1, 0]}
    checks = [(name, rows, decode(rows)) for name, rows in runs.items()]
    checks.append(("after a drop", everyone, decode(everyone, drop_after=1)))
    checks.extend(_prefix_checks(model, steps))
    for name, rows, seen in checks:
        for slot, values in enumerate(seen):
            reference = alone[rows[slot]] if isinstance(rows[slot], int) else rows[slot]
            for got, want in zip(values, reference, strict=False):
                if not bitwise_equal(got, want):
                    diff = float((got - want).abs().max())
                    raise RowInvarianceError(
                        f"{model.model_id}: a row decoded {name} with others differs from "
                        f"the same row decoded alone (max {diff:.3g}) with dtype "
                        f"{str(model.dtype).replace('torch.', '')} and {model.threads} "
                        "threads; this configuration cannot guarantee that one reference "
                        "influences only its own generation: try --dtype float32 or "
                        "another thread count"
                    )


_Check = tuple[str, list[Any], list[list[torch.Tensor]]]


def _prefix_checks(model: CheckedModel, steps: int) -> list[_Check]:
    """Rows sharing a public prefix (longer than a block, so that full blocks are shared
    and the last one copied; one row is the prefix itself) decoded together and alone."""
    prefix = "Shared prefix of the row invariance probe: " + "word " * model.block_size
    texts = [prefix + "alpha beta gamma", prefix + "delta", prefix]

    def run(indices: list[int]) -> list[list[torch.Tensor]]:
        state = _state(prompts=[])
        model.add_prompts(state, [texts[i] for i in indices], [prefix] * len(indices))
        seen: list[list[torch.Tensor]] = [[] for _ in indices]
        for s in range(steps + 1):
            step = None if s == 0 else torch.tensor(
                [(13 * s + 5 * i + 3) % model.vocab_size for i in indices])
            hidden = model.next_hidden(state, step)
            for j in range(len(indices)):
                seen[j].append(hidden[j])
        return seen

    alone = [run([i])[0] for i in range(len(texts))]
    together = run(list(range(len(texts))))
    return [("sharing a prefix", alone, together)]


def _state(prompts: list[list[int]]) -> RowDecodeState:
    return RowDecodeState(prompts=prompts)


# --------------------------------------------------------------------------------------------
# a pass on record


def check_row_invariance_cached(model: CheckedModel) -> bool:
    """:func:`check_row_invariance`, skipped when the same check already passed for the same
    configuration on this machine; returns whether it was skipped.

    The record (a small file in dplang's cache folder, ``invariance/<key>.json``) is keyed by
    everything that could decide the bits: the weights digest and model configuration, the
    backend's numerics (arithmetic, precision, block size, device), the source of every module
    of the arithmetic (:func:`arithmetic_modules`, derived from the imports), the versions of
    torch, numpy, numba, llvmlite, triton and transformers, whether the fused kernels run,
    the thread counts, the CUDA device, the environment variables that steer kernels, the CPU
    model and flags, and the Python and dplang versions.
    Any change runs the check again. ``DPLANG_RECHECK_INVARIANCE=1`` runs it whatever is on
    record, and so does a record that is not a complete pass (unreadable, not a JSON object,
    without ``"verified": true`` or without a known arithmetic): a damaged record never
    stands for a pass, nor lets the fast arithmetic replace a recorded reference one. The
    check is deterministic for a fixed key, so a recorded pass is the same decision taken
    again, at a fraction of the start-up time.

    If the check fails, it is run again with the backend's reference arithmetic (no fused
    kernels, float32 products: the same bits by design, without the fast paths); if that
    passes, the model keeps it (recorded, with a warning), else the refusal is recorded
    (:func:`record_refusal`) so that the next attempt with the same configuration is refused
    before any weight is loaded, and :class:`RowInvarianceError` is raised."""
    folder = record_folder()
    record = folder / f"{_record_key(model)}.json"
    recheck = recheck_requested()
    if not recheck:
        refused = refusal_on_record(model.refusal_key())
        if refused:
            raise RowInvarianceError(refused)
    info = {} if recheck else read_json(record)
    if info.get("verified") is True and info.get("arithmetic") in RECORDED_ARITHMETICS:
        if info.get("arithmetic") == "reference":
            model.use_reference_arithmetic()
        mark_checked(model)
        return True
    arithmetic = "fast"
    try:
        check_row_invariance(model)
    except RowInvarianceError as first:
        model.use_reference_arithmetic()
        try:
            check_row_invariance(model)
        except RowInvarianceError as second:
            message = (f"{second} (also with dplang's reference arithmetic; this is a defect "
                       "of dplang or of this platform's floating point: please report it)")
            record_refusal(model.refusal_key(), message)
            raise RowInvarianceError(message) from first
        from dplang import notices

        notices.warn(f"{first}; using dplang's reference arithmetic instead (the same bits, "
                     "slower)", stacklevel=2)
        arithmetic = "reference"
    write_json(folder, record, {"verified": True, "model_id": model.model_id,
                                "numerics": model.numerics, "arithmetic": arithmetic})
    mark_checked(model)
    return False


def mark_checked(model: CheckedModel) -> None:
    """Record on ``model`` that the check passed for its configuration as it is now (the key
    of :func:`check_row_invariance_cached`'s record: code, libraries, threads, device...)."""
    model._row_invariance_key = _record_key(model)  # type: ignore[attr-defined]


def is_checked(model: CheckedModel) -> bool:
    """Whether ``model`` passed the check for the configuration it has now: marked by
    :func:`mark_checked` with the key its configuration has at this moment (a thread count,
    library or arithmetic changed since is another configuration, not yet checked)."""
    key = getattr(model, "_row_invariance_key", None)
    return key is not None and key == _record_key(model)


def refusal_key(files: list[Path], numerics: dict[str, Any]) -> str:
    """A key for a refusal record that needs no weights loaded: the model's files (path,
    size, modification time), the numerics and what decides the code and machine."""
    import dplang

    parts = file_stamps(sorted(files))
    source = arithmetic_source_digest()
    blob = json.dumps({"files": parts, "numerics": numerics, "cpu": cpu_identity(),
                       "python": platform.python_version(), "dplang": dplang.__version__,
                       "backend_source": source, "machine": _machine_identity(None)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def record_refusal(key: str | None, message: str) -> None:
    """Remember that the configuration ``key`` (:func:`refusal_key`) was refused."""
    if key:
        folder = record_folder()
        write_json(folder, folder / f"{key}.refused.json", {"message": message})


def refusal_on_record(key: str | None) -> str | None:
    """The recorded refusal message of configuration ``key``, or ``None`` (also ``None`` when
    ``DPLANG_RECHECK_INVARIANCE=1``: the check then runs again)."""
    if not key or recheck_requested():
        return None
    message = read_json(record_folder() / f"{key}.refused.json").get("message")
    if not isinstance(message, str):
        return None
    return f"{message} [refused earlier on this machine; {RECHECK_ENV}=1 checks again]"


def _machine_identity(model: CheckedModel | None) -> dict[str, Any]:
    """What besides the code decides which kernels compute the bits: the library versions,
    the device and the environment variables that steer kernels (the CPU model and ISA flags
    are :func:`cpu_identity`) and, for a loaded ``model``, whether the fused kernels are on
    and the thread counts (torch's, process-wide, and the model's; numba's is per calling
    thread and set from the model's). Without a model (a refusal's key, computed before the
    load, after a refused check has switched the fused kernels off) only the stable part."""
    device = getattr(model, "device_type", "cpu") if model is not None else "cpu"
    identity: dict[str, Any] = {
        "packages": package_versions(),
        "device": device,
        "environment": kernel_environment(),
    }
    if model is not None:
        from dplang.models import cpu_kernels

        identity.update({"fused_kernels": bool(cpu_kernels._load()),
                         "torch_threads": torch.get_num_threads(),
                         "model_threads": getattr(model, "threads", None)})
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        identity["cuda"] = {"name": torch.cuda.get_device_name(index),
                            "capability": list(torch.cuda.get_device_capability(index)),
                            "runtime": torch.version.cuda}
    return identity


def _record_key(model: CheckedModel) -> str:
    import dplang

    source = arithmetic_source_digest()
    config = getattr(model.config, "to_json_string", None)
    identity = {
        "weights": model.weights_digest(),
        "config": config(use_diff=False) if callable(config) else repr(model.config),
        "numerics": model.numerics,
        "cpu": cpu_identity(),
        "python": platform.python_version(),
        "dplang": dplang.__version__,
        "backend_source": source,
        "machine": _machine_identity(model),
    }
    blob = json.dumps(identity, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


# --------------------------------------------------------------------------------------------
# the exact decoder's comparison with the model's own forward, on record


def verification_key(weights_digest: str, config_text: str, dtype: str) -> str:
    """The key of a recorded verification (the exact decoder reproduced the model's own
    forward): the weights, the configuration, the precision and the backend's source."""
    import dplang

    source = arithmetic_source_digest()
    blob = json.dumps({"weights": weights_digest, "config": config_text, "dtype": dtype,
                       "dplang": dplang.__version__, "backend_source": source,
                       "packages": package_versions()},
                      sort_keys=True)
    return "verified-" + hashlib.sha256(blob.encode()).hexdigest()[:32]
