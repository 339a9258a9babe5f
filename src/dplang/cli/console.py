"""What the commands print besides their results: warnings, quiet mode, generation progress.

``-q`` (``--quiet``) leaves only errors and dplang's own ``warning:`` lines (they concern
privacy or correctness, e.g. a written seed or a file without one usable reference) on
stderr, and nothing on stdout. :func:`quiet_libraries` (:mod:`dplang.api.display`) also
silences what the libraries print (transformers and huggingface_hub logging and progress bars,
the tqdm bar of the GGUF conversion, Python warnings, and C libraries writing to the stderr
descriptor, such as faiss's clustering advice during MAUVE).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import typer

from ..api.display import Display, GenerationProgress, quiet_libraries

__all__ = ["GenerationProgress", "RichDisplay", "quiet_libraries", "text_preview", "warn"]


#: Characters of a generated text shown on its live line.
PREVIEW_CHARS = 300


def text_preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """A text's live line: its ``repr`` (line breaks shown as ``\\n``), cut to ``limit``
    characters of text with an ellipsis when longer."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def warn(message: str) -> None:
    """A warning for the data holder: stderr only, never a file (it may depend on the data)."""
    typer.echo(f"warning: {message}", err=True)


class RichDisplay(Display):
    """The command line's display (:class:`dplang.api.display.Display`): a ``rich`` status
    while loading, the plan, a bar with tokens per second and the ETA, each text as it is
    written, on stderr; with ``quiet`` only ``warning:`` lines."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console

        super().__init__()
        self.quiet = quiet
        self.console = Console(stderr=True, quiet=quiet, soft_wrap=True)
        self._progress: Any = None
        self._task: Any = None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        from rich.text import Text

        with self.console.status(Text(message)):  # plain text: a path may hold "[/x]"
            yield

    def info(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)

    def warning(self, message: str) -> None:
        warn(message)

    def start(self, total: int, done: int, *, population: bool = False,
              max_tokens: int | None = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        super().start(total, done, population=population, max_tokens=max_tokens)
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"), console=self.console, transient=False)
        self._task = self._progress.add_task("generations", total=total, completed=done,
                                             rate="", eta="")
        self._progress.start()
        self._refresh()

    def _refresh(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, rate=self.meter.rate_text(),
                                  eta=self.meter.eta_text())

    def step(self, tokens: int) -> None:
        super().step(tokens)
        self._refresh()

    def result(self, record: dict[str, Any]) -> None:
        super().result(record)
        if self._progress is not None:
            self._progress.advance(self._task)
        self._refresh()
        if not self.quiet:
            from rich.markup import escape

            # escaped: a generated text is data, never markup ("[/b]" in a text would stop
            # the run with rich's MarkupError)
            self.console.print(f"[dim]#{record['group']}[/] {escape(text_preview(record['text']))}")

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
