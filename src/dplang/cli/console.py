"""What the commands print besides their results: warnings, quiet mode, generation progress.

``-q`` (``--quiet``) leaves only errors and dplang's own ``warning:`` lines (they concern
privacy or correctness, e.g. a written seed or a file without one usable reference) on
stderr, and nothing on stdout. :func:`quiet_libraries` also silences what the libraries print
while a model loads (transformers and huggingface_hub logging and progress bars, the tqdm bar
of the GGUF conversion, Python warnings).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator

import typer

__all__ = ["GenerationProgress", "quiet_libraries", "warn"]

#: Environment variables read by the libraries when they print progress or advice.
_QUIET_ENV = {
    "TQDM_DISABLE": "1",  # every tqdm bar (the GGUF conversion uses tqdm directly)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def warn(message: str) -> None:
    """A warning for the data holder: stderr only, never a file (it may depend on the data)."""
    typer.echo(f"warning: {message}", err=True)


@contextlib.contextmanager
def quiet_libraries(enabled: bool = True) -> Iterator[None]:
    """While active (when ``enabled``), the libraries print nothing but errors: environment
    variables for tqdm, huggingface_hub and transformers, their logging levels, and Python
    warnings. Everything is restored on exit (the CLI runs in-process in tests)."""
    if not enabled:
        yield
        return
    saved_env = {k: os.environ.get(k) for k in _QUIET_ENV}
    os.environ.update(_QUIET_ENV)
    loggers = [logging.getLogger(name) for name in ("transformers", "huggingface_hub",
                                                   "accelerate", "torch")]
    saved_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    restore_bars = _disable_library_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        restore_bars()
        for lg, level in zip(loggers, saved_levels, strict=True):
            lg.setLevel(level)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _disable_library_bars() -> Callable[[], None]:
    """Turn off the progress bars of transformers and huggingface_hub when they are already
    imported (a later import reads the environment variables set above); returns a function
    that restores them."""
    undo: list[Callable[[], None]] = []
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        was_enabled = hf_logging.is_progress_bar_enabled()
        verbosity = hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()

        def restore_transformers() -> None:
            hf_logging.set_verbosity(verbosity)
            if was_enabled:
                hf_logging.enable_progress_bar()

        undo.append(restore_transformers)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )

        hub_was_disabled = are_progress_bars_disabled()
        disable_progress_bars()
        if not hub_was_disabled:
            undo.append(enable_progress_bars)

    def restore() -> None:
        for fn in undo:
            fn()

    return restore


def _duration(seconds: float) -> str:
    total = max(0, round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


class GenerationProgress:
    """Tokens per second and an ETA for a generation run, from the first finished group on.

    The ETA assumes the groups still to come are as long as the finished ones on average:
    ``remaining tokens ≈ pending groups × mean tokens per finished group − tokens already
    decoded``, at the tokens-per-second rate measured so far (several groups are decoded at
    once, so counting finished groups alone would be off by the concurrency)."""

    def __init__(self, pending: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.pending = pending
        self._clock = clock
        self.start = clock()
        self.tokens = 0
        self.finished = 0
        self.finished_tokens = 0

    def step(self, tokens: int) -> None:
        self.tokens += tokens

    def group_done(self, num_tokens: int) -> None:
        self.finished += 1
        self.finished_tokens += num_tokens

    def rate(self) -> float:
        elapsed = self._clock() - self.start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def rate_text(self) -> str:
        return f"{self.rate():.1f} tok/s" if self.tokens else ""

    def eta_seconds(self) -> float | None:
        """None until a group has finished (or while no token has been counted)."""
        rate = self.rate()
        if self.finished == 0 or rate <= 0:
            return None
        if self.finished >= self.pending:
            return 0.0
        expected = self.pending * max(self.finished_tokens / self.finished, 1.0)
        return max(expected - self.tokens, 0.0) / rate

    def eta_text(self) -> str:
        eta = self.eta_seconds()
        return "ETA after the first group" if eta is None else f"ETA {_duration(eta)}"

