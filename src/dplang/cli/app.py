"""The ``dplang`` command-line application (typer).

The CLI only parses, calls the library, prints and writes files. User errors are reported as
one line on stderr (``error: ...``) with a non-zero exit code: 2 for bad input (nothing was
charged or written), 3 for a release refused by the privacy budget, 130 when interrupted. An
unexpected exception (a bug) is one line too, with exit code 1; ``DPLANG_TRACEBACK=1`` shows
its traceback.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as click_exceptions
    from typer._click.utils import make_default_short_help
except ImportError:  # pragma: no cover - older typer depends on click
    from click import exceptions as click_exceptions
    from click.utils import make_default_short_help

from .. import __version__
from .errors import CliError, echo_error

#: The commands, in the order ``dplang --help`` lists them: (module of dplang.cli, its command:
#: a function, ``command()`` for generate's registry-built one, or ``app`` for a group, and
#: the line ``dplang --help`` shows: the command's own first help line,
#: tests/cli/test_habits.py checks). A command's module is imported only when it runs or shows
#: its help, so ``dplang --help`` and ``dplang --version`` answer without the heavy libraries.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "account": ("account", "account", "InvisibleInk privacy calculation: ρ ↔ (ε, δ), the clip "
                "norm C, the Top-k+ margin."),
    "generate": ("generate", "command()", "Generate private synthetic texts from references "
                 "with InvisibleInk."),
    "experiment": ("experiment", "experiment", "Run (or resume) a sweep over method, ε, B, k, "
                   "τ and replicate; write tables and plots."),
    "report": ("report", "report", "Certify candidate statements about a private corpus, or "
               "abstain, under DP."),
    "sample": ("sample", "sample", "Release m differentially private samples of records (RSSS "
               "NeurIPS 2021 samplers)."),
    "evaluate": ("evaluate", "app", "Evaluate synthetic texts (MAUVE, perplexity/ΔPPL, lengths, "
                 "Top-k+, downstream); `dplang evaluate canaries` runs the canary check."),
    "ledger": ("ledger", "app", "The privacy ledger: datasets, budgets, spend and releases."),
    "formal": ("formal", "app", "Formal-language lab: private identification and generation of "
               "languages (papers 000, 001: docs/formal.md)."),
}


def build_command(name: str) -> Any:
    """The click command ``name``, its module imported now (generate gets the flags of every
    method registered now, a plugin's included)."""
    module_name, attr, _help = COMMANDS[name]
    module = importlib.import_module(f"{__package__}.{module_name}")
    if attr == "app":
        command = typer.main.get_command(module.app)
    else:
        function = module.command() if attr == "command()" else getattr(module, attr)
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                             rich_markup_mode=None)
        single.command(name)(function)
        command = typer.main.get_command(single)
    command.name = name
    _report_interruptions(command)
    return command


class _LazyGroup(TyperGroup):
    """The root group: commands built on first use, listed from :data:`COMMANDS`."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            self.commands[cmd_name] = build_command(cmd_name)
        return self.commands[cmd_name]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, make_default_short_help(help_line, limit))
                for name, (_m, _a, help_line) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="dplang",
    help="Differentially private language generation.",
    cls=_LazyGroup,
    add_completion=True,  # --install-completion / --show-completion (README, "Shell completion")
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dplang {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """dplang: private text generation, reports and sampling with proven guarantees."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns usage errors into one-line messages. A SIGTERM
    (``timeout``, a job scheduler, ``docker stop``, systemd) is handled as a Ctrl-C: the run
    cleans up, says what was kept and charged, and exits with 130."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(*_args: object) -> None:
    raise KeyboardInterrupt


def _non_utf8_refusal(args: list[Any]) -> str | None:
    """Why the command line cannot be run, when an argument or the current folder's path
    holds bytes that are not UTF-8 (:mod:`dplang.utf8`); else None. Refused before anything
    is read, charged or written. The current folder is not asked about for ``--help`` and
    ``--version``, which resolve no path."""
    from ..utf8 import utf8_refusal

    texts = [os.fspath(a) for a in args if isinstance(a, str | os.PathLike)]
    for arg in texts:
        refusal = isinstance(arg, str) and utf8_refusal("the argument", arg)
        if refusal:
            return refusal + " (rename the file or folder)"
    if not texts or {"--help", "-h", "--version"} & set(texts):
        return None
    try:
        here = os.getcwd()
    except OSError:  # a removed current folder: the command says so where it matters
        return None
    refusal = utf8_refusal("the current folder", here)
    return None if refusal is None else refusal + " (run it from another folder)"


def _main(argv: list[str] | None) -> int:
    from ..models.errors import ModelConfigurationError
    from ..privacy.ledger import LedgerError
    from ..release import ReleaseError

    undecodable = _non_utf8_refusal(sys.argv[1:] if argv is None else argv)
    if undecodable:
        echo_error(undecodable)
        return 2
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="dplang", standalone_mode=False)
    except CliError as exc:
        echo_error(str(exc))
        return exc.code
    except click_exceptions.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        return 2
    except click_exceptions.UsageError as exc:
        echo_error(exc.format_message().replace("\n", " "))
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        echo_error("aborted")
        return 130
    except _Interrupted as exc:
        _interrupted(exc.interrupt)
        return 130
    except KeyboardInterrupt as exc:
        _interrupted(exc)
        return 130
    except (LedgerError, ReleaseError) as exc:  # a ledger or output that cannot be used
        echo_error(_one_line(exc))
        return 2
    except ModelConfigurationError as exc:  # refused by the load-time check, or unsupported
        echo_error(f"the model cannot be used: {_one_line(exc)}")
        return 2
    except ModuleNotFoundError as exc:  # an optional extra that is not installed
        from ..extras import missing_extra_message

        message = missing_extra_message(exc, f"dplang {_command_name(argv)}")
        if message is None:
            if os.environ.get("DPLANG_TRACEBACK"):
                raise
            echo_error(f"unexpected ModuleNotFoundError: {_one_line(exc)} (a bug in dplang; "
                       "DPLANG_TRACEBACK=1 shows the traceback)")
            return 1
        echo_error(message)
        return 2
    except Exception as exc:  # a bug: one line, not a traceback (unless asked for)
        if os.environ.get("DPLANG_TRACEBACK"):
            raise
        from ..api.errors import one_line  # with what was charged, after a charge

        echo_error(f"unexpected {type(exc).__name__}: {one_line(exc)} (a bug in dplang; "
                   "DPLANG_TRACEBACK=1 shows the traceback)")
        return 1
    return result if isinstance(result, int) else 0


def _interrupted(exc: KeyboardInterrupt) -> None:
    """Ctrl-C: dplang.Interrupted says what was kept, what was charged and how to resume."""
    echo_error(_one_line(exc) if str(exc).strip() else
               "interrupted (`dplang ledger show` lists what was charged)")


def _report_interruptions(command: Any) -> None:
    """Wrap every command's callback so that a Ctrl-C reaches :func:`main` (typer would turn
    it into a silent exit code 130) as a one-line error saying what was kept and charged."""
    for sub in getattr(command, "commands", {}).values():
        _report_interruptions(sub)
    callback = getattr(command, "callback", None)
    if callback is None or getattr(callback, "_dplang_interrupts", False):
        return

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except KeyboardInterrupt as exc:
            raise _Interrupted(exc) from None

    run._dplang_interrupts = True  # type: ignore[attr-defined]
    command.callback = run


class _Interrupted(Exception):
    """A KeyboardInterrupt carried past typer (which would swallow it)."""

    def __init__(self, interrupt: KeyboardInterrupt) -> None:
        super().__init__(str(interrupt))
        self.interrupt = interrupt


def _command_name(args: Any) -> str:
    """The command of an argument list (its first word that is not a flag)."""
    words = [a for a in (args if args is not None else sys.argv[1:]) if not a.startswith("-")]
    return words[0] if words else "this command"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run() -> None:  # pragma: no cover - console script
    sys.exit(main())


if __name__ == "__main__":  # ``python -m dplang.cli.app``: the same entry point as ``dplang``
    run()
