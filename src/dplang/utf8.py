"""Names and paths that are not text: bytes that are not UTF-8 in a command line, a file name
or an environment variable reach Python as lone surrogates, which no ledger, JSON file or
terminal line can hold; a run that met one stopped half-way with an encoding error. The
command line (:mod:`dplang.cli.app`) and every release (:meth:`dplang.release.Release.open`)
refuse them up front, with :func:`utf8_refusal`'s one line. (No imports: the command line
checks its arguments before it loads any command.)"""

from __future__ import annotations

__all__ = ["utf8_refusal"]


def utf8_refusal(what: str, text: str) -> str | None:
    """The one-line refusal of ``text`` (``what`` names it: "the argument", "the ledger"...)
    when it holds bytes that are not UTF-8; None when it is text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} {text!a} is not valid UTF-8: dplang needs names and paths in UTF-8"
    return None
