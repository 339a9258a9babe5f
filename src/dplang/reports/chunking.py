"""Splitting a long record into chunks, for predicates with a bounded input window.

Rule (:func:`chunk_text`): the record is split into sentences at ``.``, ``!``, ``?`` (and
runs of them) followed by whitespace, and at line breaks; with ``pack=True`` (default)
consecutive sentences are packed greedily into chunks of at most ``max_words``
whitespace-separated words, with ``pack=False`` every sentence is its own chunk; a sentence
longer than ``max_words`` words is cut into windows of ``max_words`` words. With ``max_chunks``
only the first ``max_chunks`` chunks are kept (the rest of the record is ignored). An empty or
missing record has no chunks.

Why the sensitivity is unchanged: a chunked predicate is σ_s(r) = max over chunks c of r of
σ_s(c). The chunks of r are a function of r alone (the rule looks at no other record and at no
statistic of the corpus), and the maximum of {0,1} values is again in {0,1}. So σ_s is still a
fixed per-record {0,1} predicate, replacing one record changes the support count
Σ_r σ_s(r) by at most 1, and the replace-one sensitivity of f_s = count/n stays 1/n
(``docs/reports.md``, "Support predicates"). Taking a *sum* or *count* over chunks instead
would break this.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_MAX_WORDS", "chunk_text"]

#: Default chunk size in words (well inside a 256-token window for English text).
DEFAULT_MAX_WORDS = 48

_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")


def chunk_text(text: str | None, max_words: int = DEFAULT_MAX_WORDS,
               max_chunks: int | None = None, pack: bool = True) -> list[str]:
    """The chunks of one record under the rule in the module docstring.

    Privacy contract: a deterministic function of this one record (no corpus statistic), so
    max-over-chunks predicates keep replace-one sensitivity 1 on counts."""
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    if max_chunks is not None and max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    if not text or not text.strip():
        return []
    chunks: list[str] = []
    current: list[str] = []
    for sentence in _SENTENCES.split(text):
        words = sentence.split()
        if not words:
            continue
        if len(words) > max_words:
            if current:
                chunks.append(" ".join(current))
                current = []
            for i in range(0, len(words), max_words):
                chunks.append(" ".join(words[i:i + max_words]))
            continue
        if current and (not pack or len(current) + len(words) > max_words):
            chunks.append(" ".join(current))
            current = []
        current.extend(words)
    if current:
        chunks.append(" ".join(current))
    return chunks if max_chunks is None else chunks[:max_chunks]
