"""What a run shows while it works: loading status, its plan, a progress bar, warnings.

A :class:`Display` receives every event of a run; the library and the command line differ only
in the display they pass:

* :class:`TqdmDisplay` (the Python API's default): a ``tqdm.auto`` bar, a widget in Jupyter and
  a text bar in a terminal, and plan lines on stderr;
* ``dplang.cli.console.RichDisplay`` (the command line): ``rich`` status, bar and texts;
* :class:`Display` itself shows nothing (``quiet=True``); its warnings still go out (they
  concern privacy or correctness) as :class:`DPLangWarning`.

Also here: :class:`GenerationProgress` (tokens per second and an ETA), :func:`quiet_libraries`
(``-q``: silence what libraries print, C libraries writing to the stderr descriptor included)
and :func:`library_bars_off` (the model loaders' own bars are folded into the run's status).

Privacy contract: everything shown goes to the data holder's own terminal or notebook, never
to a file; the plan line and counts it shows may depend on the private data (row counts),
which is why they are never written to a public file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import notices
from .params import pythonize

if TYPE_CHECKING:
    from ..privacy.guarantees import Guarantee

__all__ = ["DPLangWarning", "Display", "GenerationProgress", "TqdmDisplay",
           "library_bars_off", "quiet_libraries", "short_guarantee"]


class DPLangWarning(UserWarning):
    """A warning of dplang's about privacy or correctness, for the data holder only (it may
    depend on the private data: never write it into a public file)."""


def _duration(seconds: float) -> str:
    total = max(0, round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


class GenerationProgress:
    """Tokens per second and one ETA for a generation run, from its first decoded tokens on.

    ``ETA = tokens still to decode / tokens per second so far``, where the tokens still to
    decode are ``pending groups × tokens per group − tokens decoded``, and a group's tokens are
    the mean of the finished groups once one has finished, ``max_tokens`` (T, which most
    groups reach) before that. Several groups decode at once, so counting finished groups
    alone would be off by the concurrency; the same meter feeds the command line's bar and the
    Python API's, so both show the same ETA. A population method (Aug-PE) writes every text at
    the end: it has no ETA (``population=True``)."""

    def __init__(self, pending: int, clock: Callable[[], float] = time.monotonic, *,
                 population: bool = False, max_tokens: int | None = None) -> None:
        self.pending = pending
        self.population = population
        self.max_tokens = max_tokens
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
        """None before the first decoded tokens (and without a group length to expect), and
        always for a population method."""
        rate = self.rate()
        if self.population or self.tokens == 0 or rate <= 0:
            return None
        if self.finished >= self.pending:
            return 0.0
        if self.finished:
            per_group = max(self.finished_tokens / self.finished, 1.0)
        elif self.max_tokens:
            per_group = float(self.max_tokens)
        else:
            return None
        return max(self.pending * per_group - self.tokens, 0.0) / rate

    def eta_text(self) -> str:
        if self.population:
            return "" if self.finished else "all texts come at the end"
        eta = self.eta_seconds()
        return "ETA after the first tokens" if eta is None else f"ETA {_duration(eta)}"


def short_guarantee(g: Guarantee) -> str:
    """``ρ=0.185-zCDP, (ε=3, δ=1e-06)-DP, invisibleink, replace-by-null`` (one line)."""
    rho = f"ρ={g.rho:.4g}-zCDP, " if g.rho is not None else ""
    kind = g.kind
    return f"{rho}(ε={g.epsilon:.4g}, δ={g.delta:g})-{kind}, {g.mechanism}, {g.adjacency}"


class Display:
    """The events of a run, shown nowhere (``quiet=True``) except warnings.

    Subclasses show them; the order of calls is ``status`` (around loading), ``info`` (the
    plan), ``start`` (once, after the charge), ``step``/``result`` (while decoding),
    ``finish`` (always, also after an error), with ``warning`` at any time."""

    quiet = True

    def __init__(self) -> None:
        self.meter = GenerationProgress(0)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        """Around a phase without a bar (reading the data, loading the model)."""
        yield

    def info(self, message: str) -> None:
        """A line of the run's plan for the data holder."""

    def warning(self, message: str) -> None:
        """dplang's own warning (privacy or correctness): shown even when quiet."""
        notices.warn_at_caller(pythonize(message), DPLangWarning)

    def start(self, total: int, done: int, *, population: bool = False,
              max_tokens: int | None = None) -> None:
        """Decoding starts: ``total`` generations, ``done`` of them already in the output,
        each of at most ``max_tokens`` tokens."""
        self.meter = GenerationProgress(total - done, population=population,
                                        max_tokens=max_tokens)

    def step(self, tokens: int) -> None:
        self.meter.step(tokens)

    def result(self, record: dict[str, Any]) -> None:
        """A generation was written (``record`` as in the output file)."""
        self.meter.group_done(int(record.get("num_tokens") or 0))

    def finish(self) -> None:
        """The run ended (however it ended)."""


class TqdmDisplay(Display):
    """The Python API's display: a ``tqdm.auto`` bar (a widget in Jupyter when ipywidgets is
    installed, a text bar on stderr otherwise) and plan lines on stderr."""

    quiet = False

    def __init__(self) -> None:
        super().__init__()
        self._bar: Any = None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        self.info(message)
        yield

    def info(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def start(self, total: int, done: int, *, population: bool = False,
              max_tokens: int | None = None) -> None:
        super().start(total, done, population=population, max_tokens=max_tokens)
        from tqdm.auto import tqdm

        # tqdm's own rate and remaining time count finished texts, which arrive in waves of
        # concurrent groups: only the meter's ETA (from the tokens) is shown
        self._bar = tqdm(total=total, initial=done, desc="generations", unit="text",
                         file=sys.stderr, dynamic_ncols=True,
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                    "[{elapsed}{postfix}]")
        self._refresh()

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(" ".join(t for t in (self.meter.rate_text(),
                                                           self.meter.eta_text()) if t),
                                      refresh=True)

    def step(self, tokens: int) -> None:
        super().step(tokens)
        self._refresh()

    def result(self, record: dict[str, Any]) -> None:
        super().result(record)
        if self._bar is not None:
            self._bar.update(1)
        self._refresh()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# ---------------------------------------------------------------------------------------------
# What libraries print

#: Environment variables read by the libraries when they print progress or advice.
_QUIET_ENV = {
    "TQDM_DISABLE": "1",  # every tqdm bar (the GGUF conversion uses tqdm directly)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


@contextlib.contextmanager
def quiet_libraries(enabled: bool = True) -> Iterator[None]:
    """While active (when ``enabled``), the libraries print nothing but errors: environment
    variables for tqdm, huggingface_hub and transformers, their logging levels, Python
    warnings, and what C/C++ libraries write to the stderr descriptor (faiss's clustering
    advice) while Python's own ``sys.stderr`` still reaches the terminal (errors and dplang's
    warnings). Everything is restored on exit (the CLI runs in-process in tests)."""
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
        with warnings.catch_warnings(), _native_stderr_silenced():
            warnings.simplefilter("ignore")
            warnings.simplefilter("always", DPLangWarning)
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


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null (what C/C++ code writes there is dropped) while
    ``sys.stderr``, when it wrote to descriptor 2, writes to a duplicate of the original one."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (embedded interpreters)
        yield
        return
    try:
        writes_fd2 = sys.stderr.fileno() == 2
    except (OSError, ValueError, AttributeError):  # replaced (pytest capture, Jupyter)
        writes_fd2 = False
    old_stderr = sys.stderr
    replacement = None
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        if writes_fd2:
            replacement = os.fdopen(os.dup(saved), "w", buffering=1,
                                    encoding=getattr(old_stderr, "encoding", None) or "utf-8",
                                    errors="backslashreplace")
            sys.stderr = replacement
        os.dup2(devnull, 2)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        if replacement is not None:
            sys.stderr = old_stderr
            replacement.close()


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


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """While a model loads: transformers' own bars ("Loading weights", on every load) are off,
    the run's status line stands for them; restored afterwards. transformers is imported here
    (when installed) so that its switch exists before the load imports it."""
    if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
