"""The one exception type of the Python API, and the interruption it reports.

Every refusal of :func:`dplang.generate`, :func:`dplang.report`, :func:`dplang.sample` and
:func:`dplang.account` is a :class:`DPLangError` whose message is the line the command line
prints after ``error:`` and whose :attr:`~DPLangError.code` is its exit code: 2 for input that
cannot run (nothing was charged or written), 3 for a release refused by the privacy budget
(nothing was charged or written either). A Ctrl-C (``KeyboardInterrupt``) during a run becomes
:class:`Interrupted`, a ``KeyboardInterrupt`` whose message says what was kept, what was
charged and how to resume (the command line prints it and exits with 130).
"""

from __future__ import annotations

__all__ = ["AFTER_CHARGE", "BUDGET", "INPUT", "INTERRUPTED", "DPLangError", "Interrupted"]

#: Exit codes (and :attr:`DPLangError.code`).
INPUT = 2
BUDGET = 3
#: An error after a release's charge (a full disk...): its message says what was charged.
AFTER_CHARGE = 1
#: How ``dplang.release.Release.note_failure`` starts its note (equal to
#: ``dplang.release.CHARGED_NOTE_PREFIX``; not imported: this module imports nothing of dplang).
CHARGED_NOTE_PREFIX = "after the charge: "
INTERRUPTED = 130


class DPLangError(Exception):
    """A run refused as asked, with the command line's one-line message; ``code`` is 2 (bad
    input: nothing charged or written), 3 (over the privacy budget: nothing charged or
    written) or 1 (an error after the release was charged: the message says what was charged
    and written)."""

    def __init__(self, message: str, code: int = INPUT) -> None:
        super().__init__(message)
        self.code = code

    @property
    def budget_exceeded(self) -> bool:
        """Whether the privacy ledger refused the release (exit code 3)."""
        return self.code == BUDGET


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C; ``str()`` says what was kept, what was charged and how to
    resume (one line)."""

    code = INTERRUPTED


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), with what
    was charged when the failure came after a release's charge
    (``Release.note_failure``)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    note = _charged_note(exc)
    return line if note is None else f"{line} ({note})"


def input_error(exc: BaseException) -> DPLangError:
    """:class:`DPLangError` for a refusal (code 2: nothing charged or written), or, for an
    error after a release's charge (its message says so), code 1."""
    return DPLangError(one_line(exc), INPUT if _charged_note(exc) is None else AFTER_CHARGE)


def _charged_note(exc: BaseException) -> str | None:
    """The note ``Release.note_failure`` put on ``exc``, if any."""
    return next((note for note in getattr(exc, "__notes__", ())
                 if isinstance(note, str) and note.startswith(CHARGED_NOTE_PREFIX)), None)
