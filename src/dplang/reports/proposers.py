"""Proposers: where candidate statements come from. All of them are blind to the data.

* :class:`ListProposer` — a user's list (a ``.txt`` file, one statement per line, optionally
  ``statement<TAB>regex``; see :func:`~dplang.reports.statements.read_statements_file`).
* :class:`TemplateProposer` — a public *tag-template* schema (``docs/reports.md``, "File formats"):
  the product of the values of each slot (e.g. topic × aspect × sentiment) rendered into fixed
  sentences, read from a TOML file (format below).
* :class:`LanguageModelProposer` — statements drafted by a language model from the public task
  description only, by plain (non-private) sampling.

Privacy contract: no proposer receives, reads or can be given the private records — the
constructors and :meth:`propose` take only public inputs (a file, a schema, a task text, a
public model and a seed). Hence the candidate list is a constant with respect to the data: it
costs no privacy and does not affect per-candidate honesty. ``propose`` returns the
statements *deduplicated* (first occurrence kept), which is free because it happens before the
data is touched.

Schema TOML format
------------------
::

    # one template, or several with `templates = [...]`
    template = "Reviews about {topic} commonly mention {aspect} in {sentiment} contexts."

    # each slot of the template is an array; an entry is a plain string or a table with
    # `text` (what is substituted) and an optional `pattern` (a Python regular expression)
    topic = ["restaurants", "hotels"]

    [[aspect]]
    text = "the service"
    pattern = "\\\\b(service|staff|waiter|waitress)\\\\b"

    [[sentiment]]
    text = "positive"
    pattern = "\\\\b(great|excellent|friendly|love[ds]?)\\\\b"

Statements are rendered for every combination of slot values, templates first, then slots in
order of first appearance in the template. A rendered statement's keyword rule is the
*conjunction* of its values' patterns (values without a pattern add no condition; a statement
none of whose values has a pattern has no rule). Unknown top-level keys are refused.
"""

from __future__ import annotations

import itertools
import re
import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..privacy.randomness import RandomStreams
from .statements import (
    MAX_STATEMENT_CHARS,
    Statement,
    StatementError,
    deduplicate,
    normalise_text,
    read_statements_file,
)

if TYPE_CHECKING:
    from ..models.base import LogitsModel

__all__ = [
    "LanguageModelProposer",
    "ListProposer",
    "SlotValue",
    "TemplateProposer",
    "conjunction_rule",
    "load_schema",
]


class ListProposer:
    """A fixed, user-given list of statements (public)."""

    def __init__(self, statements: Sequence[Statement | str]) -> None:
        self._statements = [s if isinstance(s, Statement) else Statement(str(s))
                            for s in statements]

    @classmethod
    def from_file(cls, path: str | Path) -> ListProposer:
        """Read ``path`` (one statement per line, optional ``<TAB>regex``)."""
        return cls(read_statements_file(path))

    @property
    def statements(self) -> list[Statement]:
        """The statements as given (duplicates kept)."""
        return list(self._statements)

    def propose(self) -> list[Statement]:
        """The statements, deduplicated. Public only: no data is read."""
        return deduplicate(self._statements)


@dataclass(frozen=True)
class SlotValue:
    """One value of a template slot: the substituted ``text`` and its optional ``pattern``."""

    text: str
    pattern: str | None = None


def conjunction_rule(patterns: Sequence[str]) -> str | tuple[str, ...] | None:
    """The keyword rule "every pattern matches somewhere": ``None`` for no pattern, the pattern
    itself for one, else the tuple of patterns (see :attr:`Statement.patterns`)."""
    patterns = [p for p in patterns if p]
    if not patterns:
        return None
    if len(patterns) == 1:
        return patterns[0]
    return tuple(patterns)


def _slots(template: str) -> list[str]:
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise StatementError(f"schema template {template!r}: malformed braces ({exc})") from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            raise StatementError(f"schema template {template!r}: slot {{{name}}} must be a "
                                 "plain name")
        if name not in names:
            names.append(name)
    return names


def _slot_values(name: str, raw: Any) -> list[SlotValue]:
    if not isinstance(raw, list) or not raw:
        raise StatementError(f"schema slot {name!r} must be a non-empty array")
    values: list[SlotValue] = []
    for item in raw:
        if isinstance(item, str):
            values.append(SlotValue(normalise_text(item)))
        elif isinstance(item, Mapping):
            unknown = set(item) - {"text", "pattern"}
            if unknown or not isinstance(item.get("text"), str):
                raise StatementError(
                    f"schema slot {name!r}: each table needs a string 'text' and may have a "
                    f"'pattern' (got keys {sorted(item)})"
                )
            pattern = item.get("pattern")
            if pattern is not None and not isinstance(pattern, str):
                raise StatementError(f"schema slot {name!r}: 'pattern' must be a string")
            if pattern:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise StatementError(
                        f"schema slot {name!r}, value {item['text']!r}: invalid pattern: {exc}"
                    ) from None
            values.append(SlotValue(normalise_text(item["text"]), pattern or None))
        else:
            raise StatementError(f"schema slot {name!r}: entries must be strings or tables")
    return values


class TemplateProposer:
    """Tag-template proposer: every combination of slot values rendered into each template.

    ``templates`` are :meth:`str.format` strings with plain-name slots; ``slots`` maps each slot
    name to its values. Public only.
    """

    def __init__(
        self, templates: Sequence[str], slots: Mapping[str, Sequence[SlotValue | str]]
    ) -> None:
        if not templates:
            raise StatementError("a schema needs at least one template")
        self.templates = [str(t) for t in templates]
        self.slots = {k: [v if isinstance(v, SlotValue) else SlotValue(str(v)) for v in vs]
                      for k, vs in slots.items()}
        for t in self.templates:
            missing = [s for s in _slots(t) if s not in self.slots]
            if missing:
                raise StatementError(f"schema template {t!r} uses slot(s) {missing} that the "
                                     "schema does not define")

    def enumerate(self) -> list[Statement]:
        """All rendered statements in a fixed order (duplicates kept)."""
        out: list[Statement] = []
        for template in self.templates:
            names = _slots(template)
            for combo in itertools.product(*(self.slots[n] for n in names)):
                text = template.format(**{n: v.text for n, v in zip(names, combo, strict=True)})
                rule = conjunction_rule([v.pattern for v in combo if v.pattern])
                out.append(Statement(normalise_text(text), rule, "schema"))
        return out

    def propose(self, m: int | None = None, rng: np.random.Generator | None = None
                ) -> list[Statement]:
        """The deduplicated enumeration, or, with ``m``, ``m`` i.i.d. uniform draws from it
        (the i.i.d. proposer of Theorem 5.2) then deduplicated. Public only."""
        statements = self.enumerate()
        if m is None:
            return deduplicate(statements)
        if rng is None:
            raise ValueError("sampling m statements needs an rng")
        picks = rng.integers(0, len(statements), size=m)
        return deduplicate(statements[i] for i in picks)


_SCHEMA_KEYS = {"template", "templates"}


def load_schema(path: str | Path) -> TemplateProposer:
    """Read a schema TOML file (format in the module docstring) into a
    :class:`TemplateProposer`. Raises :class:`StatementError` with a one-line message."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StatementError(f"schema file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StatementError(f"cannot read schema file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise StatementError(f"{path}: invalid TOML: {exc}") from None
    if ("template" in data) == ("templates" in data):
        raise StatementError(f"{path}: give exactly one of 'template' or 'templates'")
    templates = data.get("templates", [data.get("template")])
    if not isinstance(templates, list) or not all(isinstance(t, str) for t in templates):
        raise StatementError(f"{path}: 'template(s)' must be a string or an array of strings")
    used = {s for t in templates for s in _slots(t)}
    unknown = set(data) - _SCHEMA_KEYS - used
    if unknown:
        raise StatementError(f"{path}: keys {sorted(unknown)} are not slots of the template(s)")
    slots = {name: _slot_values(name, data.get(name)) for name in sorted(used)}
    return TemplateProposer(templates, slots)


_LM_PROMPT = (
    "Task: {task}\n"
    "Write one short, general statement that a report on this task could contain.\n"
    "Statement:"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _clean_draft(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = line.strip().lstrip("-*•0123456789.) ").strip().strip('"“”\'')
    line = _SENTENCE_END.split(line, maxsplit=1)[0]
    return normalise_text(line)


class LanguageModelProposer:
    """Statements drafted by a language model from the *public* task description.

    Each of ``num`` drafts is sampled without privacy (plain top-k sampling,
    :func:`dplang.textgen.engine.run_plain`) from the prompt ``prompt.format(task=task)``
    (rendered with the model's chat template when it has one); draft ``i`` uses random stream
    ``i`` of ``RandomStreams(seed)``. A draft is cut to its first line and first sentence;
    drafts with fewer than ``min_words`` words or more than ``MAX_STATEMENT_CHARS`` characters
    are dropped, the rest deduplicated.

    Privacy contract: the model and the prompt are public and the private records are never
    given to the model, so the drafts are data-independent and cost no privacy.
    """

    def __init__(
        self,
        model: LogitsModel,
        task: str,
        *,
        num: int = 20,
        max_tokens: int = 32,
        temperature: float = 1.0,
        top_k: int = 40,
        seed: int = 0,
        prompt: str = _LM_PROMPT,
        min_words: int = 3,
    ) -> None:
        if not task.strip():
            raise StatementError("the task description is empty")
        if num < 1 or max_tokens < 1:
            raise StatementError("num and max_tokens must be >= 1")
        self.model, self.task, self.num = model, task.strip(), num
        self.max_tokens, self.temperature, self.top_k = max_tokens, temperature, top_k
        self.seed, self.prompt, self.min_words = seed, prompt, min_words

    def drafts(self) -> list[str]:
        """The raw decoded drafts (before cleaning), one per random stream."""
        from ..textgen.engine import run_plain  # public API of textgen

        user = self.prompt.format(task=self.task)
        rendered = self.model.render_prompt(user)
        ids = run_plain(self.model, [rendered] * self.num, self.max_tokens, self.temperature,
                        self.top_k, RandomStreams(self.seed))
        return [self.model.decode(x) for x in ids]

    def propose(self) -> list[Statement]:
        """Cleaned, filtered and deduplicated drafts (may be fewer than ``num``)."""
        out = []
        for draft in self.drafts():
            text = _clean_draft(draft)
            if len(text.split()) >= self.min_words and len(text) <= MAX_STATEMENT_CHARS:
                out.append(Statement(text, None, "model"))
        return deduplicate(out)
