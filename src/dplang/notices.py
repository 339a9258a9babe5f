"""Warnings that never end a run.

A warning can come after a release was charged (a worker reloading its model, decode graphs
turned off, a batch with no usable reference), and whether it comes can depend on one record.
Where the program's warning filters turn warnings into errors (``python -W error``,
``warnings.simplefilter("error")``, pytest's ``filterwarnings = error``), ``warnings.warn``
would raise: the run would stop after its charge, without its output, on that record's
account, and whether an output was published would say something about the record. dplang's
own warnings therefore go through :func:`warn`, which honours every filter but "error"
(an ignored warning stays ignored) and shows a warning it would raise instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

__all__ = ["warn", "warn_at_caller"]

#: Frames from here are dplang's (or the context managers it runs in), not the caller's.
_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.path.abspath(contextlib.__file__))


def warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn(message, category, stacklevel)`` that never raises: a warning the
    filters would turn into an error is shown (``warnings.showwarning``) instead."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Warning:
        frame = sys._getframe(1)  # the caller; then ``stacklevel - 1`` frames up, as warn counts
        for _ in range(stacklevel - 1):
            if frame.f_back is None:
                break
            frame = frame.f_back
        warnings.showwarning(message, category, frame.f_code.co_filename, frame.f_lineno)


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """:func:`warn`, attributed to the first line outside dplang on the stack (the user's
    call of ``dplang.generate``, say), as a library's warning should be."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OURS):
        frame, level = frame.f_back, level + 1
    warn(message, category, stacklevel=level if frame is not None else 1)
