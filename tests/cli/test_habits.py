"""The command line's habits a new user expects (issue 26 §2): ``-h`` as well as ``--help`` on
every command, ``dplang --version``, shell completion, and help texts that say what is true."""

from __future__ import annotations

import pytest

import dplang
from dplang.cli.app import main

COMMANDS = [[], ["generate"], ["account"], ["report"], ["sample"], ["experiment"],
            ["evaluate"], ["evaluate", "canaries"], ["ledger"], ["ledger", "show"],
            ["ledger", "budget"], ["formal"], ["formal", "run"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "dplang")
def test_dash_h_is_help(capsys, command):
    assert main([*command, "-h"]) == 0
    short = capsys.readouterr().out
    assert short.startswith("Usage: dplang") and "-h, --help" in short
    assert main([*command, "--help"]) == 0
    assert capsys.readouterr().out == short


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"dplang {dplang.__version__}\n"


def test_shell_completion_script_and_completions(capsys, monkeypatch):
    with pytest.raises(SystemExit) as shown:  # typer's completion options exit at once
        main(["--show-completion", "bash"])
    assert shown.value.code == 0
    script = capsys.readouterr().out
    assert "_dplang_completion" in script and "_DPLANG_COMPLETE" in script
    # what the script asks for when the user types `dplang gen<TAB>`
    monkeypatch.setenv("_DPLANG_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "dplang gen")
    monkeypatch.setenv("COMP_CWORD", "1")
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 0 and capsys.readouterr().out.split() == ["generate"]


def test_seed_help_names_the_private_side_file(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "kept in OUT.private.json" in text and "OUT.seed" not in text
