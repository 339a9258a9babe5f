"""Candidate statements: the public objects a report certifies or abstains on.

A :class:`Statement` is a sentence plus, optionally, a *keyword rule* (a regular expression used
by :class:`~dplang.reports.predicates.KeywordPredicate`). Statements come from a proposer
(:mod:`dplang.reports.proposers`) that never sees the private data.

Privacy contract: everything in this module is a function of public inputs only (the user's
statement file, a schema, a language model's public drafts). :func:`deduplicate` must run
*before* the data is read: removing a duplicate is then free, whereas a duplicate tested twice
would cost its per-candidate budget twice (``docs/reports.md``, "The support test").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAX_STATEMENT_CHARS",
    "Statement",
    "StatementError",
    "deduplicate",
    "normalise_text",
    "read_statements_file",
    "validate_statements",
]

#: Longest statement accepted, in characters. A report's statements are short claims; a longer
#: "statement" is almost always a mistake (a paragraph pasted by accident, a wrong file), and the
#: embedding/entailment predicates would silently truncate it.
MAX_STATEMENT_CHARS = 300


class StatementError(ValueError):
    """Bad statements or statement files (one-line message)."""


@dataclass(frozen=True)
class Statement:
    """One candidate statement.

    ``text`` is the sentence that is reported if emitted. ``rule`` optionally defines the
    statement's keyword predicate: a regular expression (Python :mod:`re` syntax, searched
    case-insensitively in a record), or a tuple of them that must *all* match (a schema's
    conjunction of slot patterns); it is ignored by the other predicates. ``source`` says where
    the statement came from (``"list"``, ``"schema"``, ``"model"``) and is public.
    """

    text: str
    rule: str | tuple[str, ...] | None = None
    source: str = "list"

    @property
    def patterns(self) -> tuple[str, ...]:
        """The rule as a tuple of patterns that must all match (empty: no rule)."""
        if self.rule is None:
            return ()
        return (self.rule,) if isinstance(self.rule, str) else tuple(self.rule)


_SPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """NFC-normalise, collapse whitespace and strip: the form in which a statement is stored."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def _dedupe_key(text: str) -> str:
    # Case, surrounding whitespace and final punctuation do not make a different claim.
    return normalise_text(text).casefold().rstrip(" .!?;:")


def deduplicate(statements: Iterable[Statement]) -> list[Statement]:
    """Statements with duplicates removed (first occurrence kept, order preserved).

    Two statements are duplicates when their texts agree after :func:`normalise_text`,
    case-folding and dropping final punctuation. When duplicates carry different keyword rules
    the first one is kept. Public-only: call this before any data is read.
    """
    seen: set[str] = set()
    out: list[Statement] = []
    for s in statements:
        key = _dedupe_key(s.text)
        if not key or key in seen:
            continue
        seen.add(key)
        out.append(Statement(normalise_text(s.text), s.rule, s.source))
    return out


def validate_statements(
    statements: Sequence[Statement],
    *,
    max_chars: int = MAX_STATEMENT_CHARS,
    need_rules: bool = False,
) -> None:
    """Refuse an empty list, over-long statements, and (with ``need_rules``) missing or invalid
    keyword rules. Raises :class:`StatementError` naming the first offending statement."""
    if not statements:
        raise StatementError("no candidate statements (the statement source is empty)")
    for i, s in enumerate(statements, 1):
        if len(s.text) > max_chars:
            raise StatementError(
                f"statement {i} is {len(s.text)} characters long; the limit is {max_chars} "
                f"({s.text[:40]!r}…)"
            )
        if s.patterns:
            try:
                for pattern in s.patterns:
                    re.compile(pattern)
            except re.error as exc:
                raise StatementError(
                    f"statement {i} ({s.text[:40]!r}) has an invalid regular expression: {exc}"
                ) from None
        elif need_rules:
            raise StatementError(
                f"statement {i} ({s.text[:40]!r}) has no keyword rule; the keyword predicate "
                "needs one per statement (statement<TAB>regex in a .txt file, or patterns in "
                "the schema)"
            )


def read_statements_file(path: str | Path) -> list[Statement]:
    """Read a statements file: one statement per line, optionally ``statement<TAB>regex``.

    Blank lines and lines starting with ``#`` are ignored. Text after the first TAB is the
    statement's keyword rule (a Python regular expression, matched case-insensitively anywhere
    in a record); a line without a TAB has no rule. Duplicates are *not* removed here (see
    :func:`deduplicate`). Raises :class:`StatementError` when the file cannot be read.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StatementError(f"statements file not found: {path}") from None
    except OSError as exc:
        raise StatementError(f"cannot read statements file {path}: {exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise StatementError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    out: list[Statement] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sentence, tab, rule = line.partition("\t")
        sentence = normalise_text(sentence)
        rule = rule.strip() if tab else ""
        if not sentence:
            continue
        out.append(Statement(sentence, rule or None, "list"))
    return out
