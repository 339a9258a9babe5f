"""The command line's display prints data (generated texts, paths) as text, never as rich
markup: a text holding "[/b]" must not stop a charged run."""

import pytest

from dplang.cli.console import RichDisplay, text_preview


def test_a_text_that_looks_like_markup_is_printed_as_is(capsys):
    display = RichDisplay()
    display.start(2, 0)
    for i, text in enumerate(["a [/b] closing tag", "[bold]not bold[/bold] [/]"]):
        display.result({"group": i, "text": text})
    display.finish()
    err = capsys.readouterr().err
    assert "a [/b] closing tag" in err and "[bold]not bold[/bold] [/]" in err


def test_a_status_message_with_brackets(capsys):
    with RichDisplay().status("loading /models/[/x]/m…"):
        pass


@pytest.mark.parametrize(("text", "shown"), [
    ("short", "'short'"), ("x" * 300, repr("x" * 300)), ("x" * 301, repr("x" * 300) + "…"),
    ("two\nlines", "'two\\nlines'"),
])
def test_text_preview(text, shown):
    assert text_preview(text) == shown
