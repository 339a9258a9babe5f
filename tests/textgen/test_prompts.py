"""Tests for dplang.textgen.prompts: public/private prompt forms."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dplang.textgen.prompts import (
    BUILTIN_TEMPLATES,
    DEFAULT_MAX_REFERENCE_TOKENS,
    DEFAULT_TEMPLATE,
    SYSTEM_PROMPT,
    PromptTemplate,
    get_template,
    load_template_file,
    normalise_yelp_labels,
)

YELP_LABELS = {"category": "Restaurants", "stars": "4.0"}
RAW_YELP_LABELS = {"label1": "Business Category: Restaurants", "label2": "Review Stars: 4.0"}
LABELS = {"yelp": YELP_LABELS, "tab": {}, "mimic": {}, "generic": {}}


def common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]


ALL = [(name, chat) for name in BUILTIN_TEMPLATES for chat in (True, False)]


def test_builtins_exist() -> None:
    assert set(BUILTIN_TEMPLATES) == {"generic", "yelp", "tab", "mimic"}
    assert DEFAULT_MAX_REFERENCE_TOKENS == 256


@pytest.mark.parametrize("chat", [True, False])
def test_default_template_needs_no_label(chat: bool) -> None:
    """The default works on any text column: no label slot, so no --group-by is needed."""
    template = get_template(DEFAULT_TEMPLATE, chat=chat)
    assert DEFAULT_TEMPLATE == "generic" and template.label_slots == ()
    template.check_labels([])
    assert "a review" in template.render("a review", {})


def test_label_error_points_to_prompt_and_group_by() -> None:
    with pytest.raises(ValueError) as info:
        get_template("yelp", chat=False).check_labels([])
    message = str(info.value)
    assert "--group-by" in message and "--prompt generic" in message and "\n" not in message


@pytest.mark.parametrize("name,chat", ALL)
@pytest.mark.parametrize("empty", [None, "", " ", "\n\t  \r\n", "\u3000"])
def test_empty_reference_is_exactly_public(name: str, chat: bool, empty: str | None) -> None:
    template = get_template(name, chat=chat)
    labels = LABELS[name]
    public = template.public_text.format(**labels)
    assert template.render(empty, labels) == public
    assert template.public(labels) == public


@pytest.mark.parametrize("name,chat", ALL)
def test_private_form_contains_reference(name: str, chat: bool) -> None:
    template = get_template(name, chat=chat)
    reference = "A {braced} reference with {reference} and {{ braces }} inside."
    rendered = template.render(reference, LABELS[name])
    assert reference in rendered  # inserted literally, braces are inert
    assert rendered != template.public(LABELS[name])
    assert "{" + "reference" + "}" not in template.public_text


@pytest.mark.parametrize("name,chat", ALL)
@given(ws=st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=10))
def test_any_whitespace_reference_is_public(name: str, chat: bool, ws: str) -> None:
    template = get_template(name, chat=chat)
    assert template.render(ws, LABELS[name]) == template.public(LABELS[name])


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_forms_and_system_prompts(name: str) -> None:
    instruction = get_template(name, chat=True)
    completion = get_template(name, chat=False)
    assert instruction.system == SYSTEM_PROMPT == "You are a chatbot"
    assert instruction.form == "instruction"
    assert completion.system is None and completion.form == "completion"
    # completion forms end with the same cue (the text the model continues)
    suffix = common_suffix(completion.private_text, completion.public_text)
    assert len(suffix) >= 30
    assert "{reference}" not in suffix
    rendered_private = completion.render("some reference text", LABELS[name])
    rendered_public = completion.render(None, LABELS[name])
    common = common_suffix(rendered_private, rendered_public)
    assert len(common) >= 30


def test_instruction_prompts_verbatim() -> None:
    yelp = get_template("yelp", chat=True)
    assert yelp.render("Nice place.", YELP_LABELS) == (
        "Here is a text with Business Category : “Restaurants” and Review Stars : “4.0” out of "
        "5.0.\nText: “Nice place.”\nPlease output one more similar review of a fictional place "
        "with the same score and of the same category of business. Poor reviews have lower "
        "scores and good reviews have higher scores."
    )
    assert yelp.public(YELP_LABELS) == (
        "Please give me a fake Yelp customer review of a fictional business with Business "
        "Category : “Restaurants” and Review Stars : “4.0” out of 5.0. Poor reviews have lower "
        "scores and good reviews have higher scores."
    )
    tab = get_template("tab", chat=True)
    assert tab.public({}) == (
        "Please output a transcript of a fictional case under European Court for Human Rights. "
        "Begin with the phrase: ‘PROCEDURE: The case originated in an application’."
    )
    mimic = get_template("mimic", chat=True)
    assert mimic.render("X", {}).startswith(
        "Here is the text of the discharge summary of a patient discharged from a hospital\n"
        "Text: “X”\nPlease give me another text of a fake patient discharge summary"
    )
    assert mimic.public({}).endswith(
        "The output text must begin with the exact words “Discharge Instructions:”."
    )


def test_completion_prompts() -> None:
    yelp = get_template("yelp", chat=False)
    assert yelp.render("Great.", YELP_LABELS) == (
        "Here is a 4.0-star review of a business in the category Restaurants:\nGreat.\n\n"
        "Here is another 4.0-star review of a business in the category Restaurants:\n"
    )
    assert yelp.render(None, YELP_LABELS) == (
        "Here is a 4.0-star review of a business in the category Restaurants:\n"
    )
    assert (
        get_template("tab", chat=False)
        .public({})
        .endswith("PROCEDURE: The case originated in an application")
    )
    assert get_template("mimic", chat=False).public({}).endswith("Discharge Instructions:\n")


def test_yelp_labels() -> None:
    assert normalise_yelp_labels(RAW_YELP_LABELS) == YELP_LABELS
    assert normalise_yelp_labels({"b": "Review Stars: 1.0", "a": "Business Category: Bars"}) == {
        "category": "Bars",
        "stars": "1.0",
    }
    assert normalise_yelp_labels({"category": "Shopping", "label2": "Review Stars:2.0"}) == {
        "category": "Shopping",
        "stars": "2.0",
    }
    assert normalise_yelp_labels({}) == {}
    for chat in (True, False):
        template = get_template("yelp", chat=chat)
        assert template.render("r", RAW_YELP_LABELS) == template.render("r", YELP_LABELS)
        assert template.render(None, RAW_YELP_LABELS) == template.public(YELP_LABELS)
        template.check_labels(["label1", "label2"])
        with pytest.raises(ValueError, match="needs label 'category'"):
            template.render("r", {"stars": "5.0"})
        with pytest.raises(ValueError, match="needs label 'category'"):
            get_template("yelp", chat=chat, label_columns=["stars"])


def test_unknown_template_name() -> None:
    with pytest.raises(ValueError, match=r"unknown template 'nope'.*mimic, tab, yelp"):
        get_template("nope", chat=True)


# ---------------------------------------------------------------------------- custom TOML


def write(tmp_path: Path, text: str, name: str = "t.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_custom_template(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'system = "Be brief"\n'
        'private = """A {product} ticket:\n{reference}\n\nAnother {product} ticket:\n"""\n'
        'public = """A {product} ticket:\n"""\n',
        name="tickets.toml",
    )
    for chat in (True, False):
        template = get_template(path, chat=chat, label_columns=["product"])
        assert template.name == "tickets" and template.system == "Be brief"
        assert template.form == "custom"
        assert template.render("It broke.", {"product": "kettle"}) == (
            "A kettle ticket:\nIt broke.\n\nAnother kettle ticket:\n"
        )
        assert template.render("  ", {"product": "kettle"}) == "A kettle ticket:\n"
        assert template.render(None, {"product": "kettle"}) == "A kettle ticket:\n"
    assert get_template(str(path), chat=True).label_slots == ("product",)


@pytest.mark.parametrize(
    "body,match",
    [
        ('private = "no slot"\npublic = "p"\n', r"private prompt must contain \{reference\}"),
        ('private = "{reference}"\npublic = "{reference}"\n', r"public prompt must not contain"),
        ('private = "{reference} {0}"\npublic = "p"\n', "not a plain name"),
        ('private = "{reference} {a.b}"\npublic = "p"\n', "not a plain name"),
        ('private = "{reference!r}"\npublic = "p"\n', "conversion or format spec"),
        ('private = "{reference:>10}"\npublic = "p"\n', "conversion or format spec"),
        ('private = "{reference} {"\npublic = "p"\n', "malformed braces"),
        ('private = "{reference}"\npublic = "p"\nextra = "x"\n', r"unknown key\(s\) extra"),
        ('private = "{reference}"\n', "missing key 'public'"),
        ('private = "{reference}"\npublic = 3\n', "'public' must be a string"),
        ('private = "{reference}\npublic = "p"\n', "invalid TOML"),
        ('private = "{reference} {color}"\npublic = "p {size}"\n', r"unknown slot\(s\) \{color\}"),
    ],
)
def test_custom_template_errors(tmp_path: Path, body: str, match: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ValueError, match=match) as info:
        get_template(path, chat=False, label_columns=["product"])
    assert "\n" not in str(info.value)


def test_custom_template_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="template file not found"):
        load_template_file(tmp_path / "missing.toml")


def test_custom_slots_unchecked_without_columns(tmp_path: Path) -> None:
    path = write(tmp_path, 'private = "{topic}: {reference}"\npublic = "{topic}:"\n')
    template = get_template(path, chat=False)
    assert template.render(None, {"topic": "x"}) == "x:"
    with pytest.raises(ValueError, match="needs label 'topic'"):
        template.render("r", {})


def test_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match="must contain"):
        PromptTemplate(name="bad", private_text="p", public_text="q")
    ok = PromptTemplate(name="ok", private_text="{{literal}} {reference}", public_text="{{x}}")
    assert ok.render("r", {}) == "{literal} r"
    assert ok.render("", {}) == "{x}"
