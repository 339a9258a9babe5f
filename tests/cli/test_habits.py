"""The command line's habits a new user expects: ``-h`` as well as ``--help`` on
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
    # typer detects the shell from the parent processes; a test run by a detached `make`
    # has none, so the detection is fixed to bash here.
    import typer.completion

    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
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
    assert ".dplang-private/OUT.private.json" in text and "OUT.seed" not in text


HEAVY = ("torch", "scipy.optimize", "scipy.stats", "transformers", "pandas", "pyarrow",
         "sklearn", "matplotlib", "faiss", "sentence_transformers", "ray")


def test_help_imports_no_heavy_library():
    """Every command's help, and --version, import no heavy library (torch, scipy, ...: 5 s
    when imported to build the commands), so they answer in well under 1 s."""
    import subprocess
    import sys

    script = (
        "import contextlib, io, json, sys\n"
        "from dplang.cli.app import main\n"
        f"for args in {[[*c, '-h'] for c in COMMANDS] + [['--version']]!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(args) == 0, args\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_command_list_is_each_commands_own_help():
    from dplang.cli.app import COMMANDS, build_command

    for name, (_module, _attr, line) in COMMANDS.items():
        command = build_command(name)
        assert command.help.strip().splitlines()[0] == line, name


def test_sample_help_names_every_sampler():
    from dplang.cli.sample import METHODS
    from dplang.sampling.release import METHODS as SAMPLERS

    assert METHODS == SAMPLERS


def test_a_refused_flag_imports_no_heavy_library(tmp_path):
    """Issue 35 §6: a run refused for its flags (here --epsilon -1) answers in milliseconds,
    as docs/generation.md says: no torch (1.5 s) is imported to say so."""
    import subprocess
    import sys

    data = tmp_path / "d.csv"
    data.write_text("text\nfine\n")
    script = (
        "import contextlib, io, json, sys\n"
        "from dplang.cli.app import main\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n"
        f"    assert main(['generate', '--data', {str(data)!r}, '--epsilon', '-1', '--out', "
        f"{str(tmp_path / 'o.jsonl')!r}]) == 2\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
