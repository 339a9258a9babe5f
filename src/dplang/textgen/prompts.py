"""Prompt templates: a private form (with the reference) and a public form (without).

A :class:`PromptTemplate` holds two user-message templates written with :meth:`str.format`
slots: the *private* form must contain ``{reference}``; the *public* form must not. Other
slots (``{category}``, ``{stars}``, or any group-by column name for a custom template) are
filled from the batch's labels, which are public metadata (see
:mod:`dplang.textgen.batching`). Only plain names are allowed as slots (no ``{0}``, ``{a.b}``,
``{a[0]}``, conversions or format specs); write literal braces as ``{{`` and ``}}``.

**Privacy invariant** (docs/privacy.md invariant 1). InvisibleInk's sensitivity
bound C/B (replace-by-null adjacency) assumes that the logits given the empty reference are
*exactly* the public logits. :meth:`PromptTemplate.render` therefore returns the public form
whenever the reference is ``None``, ``""`` or whitespace only -- by construction, not by
substituting an empty string into the private form. The public prompt *is* what an empty
reference means; a model that renders the private form with ``reference=""`` would double the
sensitivity.

Each built-in template comes in two forms. ``generic`` (the default) needs no label and works on
any text column; ``yelp``, ``tab`` and ``mimic`` are the paper's data sets (``yelp`` needs the
labels ``category`` and ``stars``, from ``--group-by``) and are opt-in.

* ``instruction`` -- the InvisibleInk paper's Table 5 prompts verbatim, with the system prompt
  "You are a chatbot"; for instruction-tuned models that have a chat template (``generic``:
  the same shape without a domain);
* ``completion`` -- for base models without a chat template (such as the default Gemma 3
  270M), which continue text rather than follow instructions. The public and the private
  version end with the same cue (the text the model continues), so both rows of a batch ask
  the model to continue the same thing; no system prompt.

Custom templates are TOML files::

    # my_template.toml
    name = "support-tickets"        # optional; defaults to the file name
    system = "You are a chatbot"    # optional; the system prompt for chat models
    private = \"\"\"Here is a {product} support ticket:
    {reference}

    Here is another {product} support ticket:
    \"\"\"
    public = \"\"\"Here is a {product} support ticket:
    \"\"\"

Keys other than ``name``, ``system``, ``private`` and ``public`` are refused. Slots other than
``reference`` are filled from the group-by label columns of the same name.

References longer than :data:`DEFAULT_MAX_REFERENCE_TOKENS` model tokens are truncated by the
model backend, not here.
"""

from __future__ import annotations

import string
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_MAX_REFERENCE_TOKENS",
    "DEFAULT_TEMPLATE",
    "SYSTEM_PROMPT",
    "PromptTemplate",
    "check_description",
    "get_template",
    "load_template_file",
    "normalise_yelp_labels",
    "template_slots",
]

DEFAULT_MAX_REFERENCE_TOKENS = 256
"""References are truncated to their first 256 model tokens before they enter the prompt.

The rule depends only on the public tokenizer and this constant, never on the data set
(e.g. not on an average or maximum length), so it adds no data-dependent choice (docs/privacy.md
invariant 4). The model backend applies it.
"""

DEFAULT_TEMPLATE = "generic"
"""The template ``dplang generate`` and experiment configs use unless told otherwise: it has no
label slot, so it works on any file with a text column."""

SYSTEM_PROMPT = "You are a chatbot"
"""System prompt of the InvisibleInk paper's experiments (Table 5), used with the instruction
forms."""

REFERENCE_SLOT = "reference"

_FORMATTER = string.Formatter()


def template_slots(text: str, what: str = "template") -> tuple[str, ...]:
    """The slot names used in ``text`` (in order of first use); ValueError if malformed."""
    names: list[str] = []
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as exc:
        raise ValueError(
            f"{what}: malformed braces ({exc}); write literal braces as {{{{ and }}}}"
        ) from None
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(
                f"{what}: slot {{{name}}} is not a plain name; use slots like {{category}}"
            )
        if spec or conversion:
            raise ValueError(f"{what}: slot {{{name}}} may not have a conversion or format spec")
        if name not in names:
            names.append(name)
    return tuple(names)


_YELP_PREFIXES = {"category": "Business Category:", "stars": "Review Stars:"}
_YELP_FALLBACK_KEYS = {"category": "label1", "stars": "label2"}


def normalise_yelp_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Map Yelp label columns to ``{"category": ..., "stars": ...}``.

    ``label1 = "Business Category: Restaurants"`` and ``label2 = "Review Stars: 5.0"`` (the
    processed Yelp release) become ``{"category": "Restaurants", "stars": "5.0"}``. Values are
    recognised by their prefix in any column, then ``label1``/``label2`` are used by position;
    existing ``category``/``stars`` keys win. Keys that cannot be found are left out.
    """
    out: dict[str, str] = {}
    for slot, prefix in _YELP_PREFIXES.items():
        if slot in labels:
            out[slot] = _strip_prefix(str(labels[slot]), prefix)
            continue
        for value in labels.values():
            if isinstance(value, str) and value.strip().lower().startswith(prefix.lower()):
                out[slot] = _strip_prefix(value, prefix)
                break
        else:
            key = _YELP_FALLBACK_KEYS[slot]
            if key in labels:
                out[slot] = _strip_prefix(str(labels[key]), prefix)
    return out


def _strip_prefix(value: str, prefix: str) -> str:
    value = value.strip()
    if value.lower().startswith(prefix.lower()):
        value = value[len(prefix) :].strip()
    return value


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt with a private form (``{reference}``) and a public form.

    ``render(None | "" | whitespace, labels)`` returns exactly the public form (module
    docstring). ``system`` is the system prompt for chat models, or ``None``.
    ``form`` is ``"instruction"``, ``"completion"`` or ``"custom"``. ``label_normaliser``
    optionally derives slot values from the labels (the yelp templates map
    ``label1``/``label2`` to ``category``/``stars``).
    """

    name: str
    private_text: str
    public_text: str
    system: str | None = None
    form: str = "custom"
    label_normaliser: Callable[[Mapping[str, str]], dict[str, str]] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        what = f"template {self.name!r}"
        private = template_slots(self.private_text, f"{what} (private)")
        public = template_slots(self.public_text, f"{what} (public)")
        if REFERENCE_SLOT not in private:
            raise ValueError(f"{what}: the private prompt must contain {{reference}}")
        if REFERENCE_SLOT in public:
            raise ValueError(f"{what}: the public prompt must not contain {{reference}}")

    @property
    def label_slots(self) -> tuple[str, ...]:
        """Slots filled from labels (every slot but ``reference``), private form first."""
        slots = template_slots(self.private_text) + template_slots(self.public_text)
        return tuple(s for s in dict.fromkeys(slots) if s != REFERENCE_SLOT)

    def slot_values(self, labels: Mapping[str, str] | None = None) -> dict[str, str]:
        """The label-slot values for ``labels``; ValueError naming a slot that is missing."""
        labels = dict(labels or {})
        if self.label_normaliser is not None:
            missing = [s for s in self.label_slots if s not in labels]
            if missing:
                labels.update(self.label_normaliser(labels))
        values: dict[str, str] = {}
        for slot in self.label_slots:
            if slot not in labels:
                got = ", ".join(sorted(labels)) or "none"
                raise ValueError(
                    f"template {self.name!r} needs label {slot!r} (labels given: {got}); "
                    f"group by a column of that name (--group-by) or choose a template "
                    f"without labels (--prompt {DEFAULT_TEMPLATE}, or a .toml file)"
                )
            values[slot] = str(labels[slot])
        return values

    def check_labels(self, columns: Sequence[str]) -> None:
        """Raise ValueError unless label columns ``columns`` can fill every label slot."""
        self.slot_values(dict.fromkeys(columns, "x"))

    def public(self, labels: Mapping[str, str] | None = None) -> str:
        """The public user prompt (no reference)."""
        return self.public_text.format_map(self.slot_values(labels))

    def render(self, reference: str | None, labels: Mapping[str, str] | None = None) -> str:
        """The user prompt for ``reference``: the private form, or exactly the public form
        when ``reference`` is ``None``, empty or whitespace only (the null reference)."""
        values = self.slot_values(labels)
        if reference is None or not reference.strip():
            return self.public_text.format_map(values)
        # format_map parses only the template; braces inside the reference are inert.
        return self.private_text.format_map({**values, REFERENCE_SLOT: reference})


# --------------------------------------------------------------------------------------------
# built-in templates

# Spec §4.4 (paper Table 5), verbatim; "Text:" and the request start on new lines. ``generic``
# is dplang's own, in the same shape, for data of any domain.
_INSTRUCTION = {
    "generic": (
        "Here is a text.\n"
        "Text: “{reference}”\n"
        "Please output one more similar text: of the same kind, on a similar subject and in "
        "the same style and length.",
        "Please output a short text of the kind people write.",
    ),
    "yelp": (
        "Here is a text with Business Category : “{category}” and Review Stars : “{stars}” "
        "out of 5.0.\n"
        "Text: “{reference}”\n"
        "Please output one more similar review of a fictional place with the same score and "
        "of the same category of business. Poor reviews have lower scores and good reviews "
        "have higher scores.",
        "Please give me a fake Yelp customer review of a fictional business with Business "
        "Category : “{category}” and Review Stars : “{stars}” out of 5.0. Poor reviews have "
        "lower scores and good reviews have higher scores.",
    ),
    "tab": (
        "Here is the text of a case transcript set before the European Court for Human "
        "Rights.\n"
        "Text: “{reference}”\n"
        "Please output a similar transcript of a fictional case under European Court for "
        "Human Rights. Begin with the phrase: ‘PROCEDURE: The case originated in an "
        "application’.",
        "Please output a transcript of a fictional case under European Court for Human "
        "Rights. Begin with the phrase: ‘PROCEDURE: The case originated in an application’.",
    ),
    "mimic": (
        "Here is the text of the discharge summary of a patient discharged from a hospital\n"
        "Text: “{reference}”\n"
        "Please give me another text of a fake patient discharge summary for discharge from a "
        "hospital. Include typical sections like admitting diagnosis, major procedures (if "
        "any), discharge medications (using fictional drug names and dosages), and general "
        "follow-up instructions. Do not include any names, dates, or specific medical record "
        "numbers. The output text must begin with the exact words “Discharge Instructions:”.",
        "Please give me text of a fake patient discharge summary for discharge from a "
        "hospital. I only need fictional and representative examples for a non-medical "
        "purpose. Include typical sections like admitting diagnosis, major procedures (if "
        "any), discharge medications (using fictional drug names and dosages), and general "
        "follow-up instructions. Do not include any names, dates, or specific medical record "
        "numbers. The output text must begin with the exact words “Discharge Instructions:”.",
    ),
}

# Completion forms for base models: "<header>\n<reference>\n\n<header for another>\n<cue>".
# Public and private versions end with the same cue, which the model continues.
_YELP_HEAD = "Here is a {stars}-star review of a business in the category {category}:\n"
_TAB_HEAD = "Here is the text of a case transcript set before the European Court of Human Rights"
_TAB_CUE = ":\n\nPROCEDURE: The case originated in an application"
_MIMIC_HEAD = "Here is the discharge summary of a patient discharged from a hospital"
_MIMIC_CUE = ":\n\nDischarge Instructions:\n"
_GENERIC_HEAD = "Here is a piece of text written by a person:\n"
_COMPLETION = {
    "generic": (
        _GENERIC_HEAD + "{reference}\n\nHere is another piece of text written by a person:\n",
        _GENERIC_HEAD,
    ),
    "yelp": (
        _YELP_HEAD
        + "{reference}\n\n"
        + "Here is another {stars}-star review of a business in the category {category}:\n",
        _YELP_HEAD,
    ),
    "tab": (
        _TAB_HEAD + ":\n\n{reference}\n\n"
        "Here is the text of another case transcript set before the European Court of Human "
        "Rights" + _TAB_CUE,
        _TAB_HEAD + _TAB_CUE,
    ),
    "mimic": (
        _MIMIC_HEAD + ":\n\n{reference}\n\n"
        "Here is the discharge summary of another patient discharged from a hospital" + _MIMIC_CUE,
        _MIMIC_HEAD + _MIMIC_CUE,
    ),
}

_NORMALISERS: dict[str, Callable[[Mapping[str, str]], dict[str, str]]] = {
    "yelp": normalise_yelp_labels,
}


def _builtin(name: str, chat: bool) -> PromptTemplate:
    private, public = (_INSTRUCTION if chat else _COMPLETION)[name]
    return PromptTemplate(
        name=name,
        private_text=private,
        public_text=public,
        system=SYSTEM_PROMPT if chat else None,
        form="instruction" if chat else "completion",
        label_normaliser=_NORMALISERS.get(name),
    )


#: Names of the built-in templates.
BUILTIN_TEMPLATES: tuple[str, ...] = tuple(sorted(_INSTRUCTION))

_TOML_KEYS = frozenset({"name", "system", "private", "public"})


def load_template_file(
    path: str | Path, label_columns: Sequence[str] | None = None
) -> PromptTemplate:
    """Load a custom TOML template (format in the module docstring).

    With ``label_columns``, every slot other than ``{reference}`` must be one of them.
    Raises a one-line :class:`ValueError` for any problem.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: template file not found") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: template file is not valid UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML ({exc})") from None
    unknown = sorted(set(data) - _TOML_KEYS)
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {', '.join(unknown)}; allowed: name, system, private, public"
        )
    for key in ("private", "public"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    for key in _TOML_KEYS & set(data):
        if not isinstance(data[key], str):
            raise ValueError(f"{path}: {key!r} must be a string")
    name = data.get("name", path.stem)
    template = PromptTemplate(
        name=name,
        private_text=data["private"],
        public_text=data["public"],
        system=data.get("system"),
        form="custom",
    )
    if label_columns is not None:
        unknown_slots = [s for s in template.label_slots if s not in label_columns]
        if unknown_slots:
            known = ", ".join(label_columns) or "none"
            raise ValueError(
                f"{path}: unknown slot(s) {', '.join('{' + s + '}' for s in unknown_slots)}; "
                f"slots must be 'reference' or a group-by column ({known})"
            )
    return template


#: Longest accepted ``--describe`` text (characters).
MAX_DESCRIPTION = 300


def check_description(description: str | None) -> str | None:
    """``description`` stripped, or ``None``; ValueError for an empty or over-long one, or
    one with a line break (it is one phrase inside the prompt)."""
    if description is None:
        return None
    if "\n" in description.strip() or "\r" in description.strip():
        raise ValueError("the description is one line (a phrase such as 'restaurant reviews "
                         "from Yelp')")
    text = " ".join(description.split())
    if not text:
        raise ValueError("the description is empty; say what the texts are, e.g. 'restaurant "
                         "reviews from Yelp'")
    if len(text) > MAX_DESCRIPTION:
        raise ValueError(f"the description has {len(text)} characters; at most "
                         f"{MAX_DESCRIPTION} (a phrase: for a longer prompt write a template "
                         "file, --prompt FILE.toml)")
    return text


def _described(description: str, chat: bool) -> PromptTemplate:
    """The generic template with a public description of the corpus in both forms."""
    d = description.replace("{", "{{").replace("}", "}}")  # literal text, not slots
    if chat:
        private = (f"Here is a text from a collection of {d}.\n"
                   "Text: “{reference}”\n"
                   "Please output one more similar text: of the same kind, on a similar subject "
                   "and in the same style and length.")
        public = f"Please output a short text of the kind found in a collection of {d}."
    else:
        head = f"Here is a text from a collection of {d}:\n"
        private = head + "{reference}\n\n" + f"Here is another text from the collection of {d}:\n"
        public = head
    return PromptTemplate(name=DEFAULT_TEMPLATE, private_text=private, public_text=public,
                          system=SYSTEM_PROMPT if chat else None,
                          form="instruction" if chat else "completion")


def get_template(
    name_or_path: str | Path, chat: bool, label_columns: Sequence[str] | None = None,
    description: str | None = None,
) -> PromptTemplate:
    """A built-in template (``generic``, ``yelp``, ``tab``, ``mimic``) or a custom TOML file.

    ``chat=True`` picks the instruction form (model with a chat template), ``chat=False`` the
    completion form (base model). A custom file has a single form and ``chat`` is ignored.
    With ``label_columns`` the template's label slots are checked against those columns.
    ``description`` (``--describe``: a PUBLIC phrase saying what the texts are, e.g.
    "restaurant reviews from Yelp") goes into both forms of the generic template; the other
    templates already say what their texts are, and refuse it.
    """
    key = str(name_or_path)
    description = check_description(description)
    if description is not None:
        if key.lower() != DEFAULT_TEMPLATE:
            raise ValueError(f"a description (--describe) applies to the {DEFAULT_TEMPLATE} "
                             f"template; {key!r} already says what its texts are (write the "
                             "description into a template file instead)")
        return _described(description, chat)
    if key.lower() in _INSTRUCTION:
        template = _builtin(key.lower(), chat)
        if label_columns is not None:
            template.check_labels(label_columns)
        return template
    path = Path(name_or_path)
    if path.suffix.lower() == ".toml" or path.exists():
        return load_template_file(path, label_columns)
    raise ValueError(
        f"unknown template {key!r}; use one of {', '.join(BUILTIN_TEMPLATES)} "
        "or a path to a .toml file"
    )
