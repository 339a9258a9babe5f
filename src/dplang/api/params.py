"""Python-shaped arguments and messages for the API functions (:func:`python_api`).

The API functions share their checks and messages with the command line, whose messages name
flags (``--num must be >= 1``). A call from Python should hear about its own keywords, and a
value of the wrong type should be refused by name before anything runs, not surface as a
``TypeError`` or ``AttributeError`` from deep inside, nor be coerced (``epsilon=True`` is not
ε = 1). :func:`python_api` wraps an API function so that:

* a keyword it does not take (a typo) is a :class:`DPLangError` suggesting the closest one
  ("did you mean max_tokens?");
* every argument is checked against the function's annotations: numbers must be numbers (a
  ``bool`` is not one; an ``int`` is a ``float``), strings strings, paths strings or
  ``os.PathLike``; ``Any`` and annotations it does not read are not checked;
* a :class:`DPLangError` from the shared checks has its flags translated to the keywords
  (``--max-tokens`` → ``max_tokens``, a method's ``--amin-sigma`` → ``sigma``) and the
  temporary file that holds in-memory data named ``data``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import numbers
import os
import re
import tempfile
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .errors import DPLangError

__all__ = ["python_api", "pythonize", "unknown_keyword"]

F = TypeVar("F", bound=Callable[..., Any])

_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def _method_flags() -> dict[str, str]:
    """``--<method>-<option>`` → the option's keyword, for every registered method."""
    try:
        from ..textgen.methods.registry import all_methods
    except ImportError:  # pragma: no cover - a trimmed install
        return {}
    return {spec_opt.flag(spec.name): spec_opt.name
            for spec in all_methods() for spec_opt in spec.options}


def pythonize(message: str) -> str:
    """``message`` with the command line's flags as keywords and the in-memory data's
    temporary file as ``data``."""
    methods = _method_flags()

    def keyword(match: re.Match[str]) -> str:
        flag = "--" + match.group(1)
        if flag.startswith("--no-"):  # a switch's off side (--split/--no-split): split=False
            return f"{match.group(1)[3:].replace('-', '_')}=False"
        return methods.get(flag, match.group(1).replace("-", "_"))

    # a flag with a quoted value reads as a keyword argument: --describe "x" → describe="x"
    message = re.sub(_FLAG.pattern + r' (".*?")',
                     lambda m: f"{keyword(m)}={m.group(2)}", message)
    message = _FLAG.sub(keyword, message)
    base = re.escape(str(Path(tempfile.gettempdir())))
    # the in-memory data's file (api/data.py: named by a digest of the data, which must not
    # reach the output a notebook shows) and a call's temporary output folder (api/outputs.py)
    message = re.sub(base + r"/dplang-(?:\d+/[0-9a-f]{32}|data-[^/\s]+)/in-memory\.arrow",
                     "data", message)
    return re.sub(base + r"/dplang-run-[^/\s]+/[^\s:,;)]*", "the call's temporary output",
                  message)


def unknown_keyword(function: str, name: str, known: Sequence[str]) -> DPLangError:
    """The refusal of keyword ``name``, with the closest known keyword when there is one."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f" (it takes {', '.join(known)})"
    return DPLangError(f"{function}() got an unknown keyword {name!r}{hint}")


def _type_name(kind: Any) -> str:
    if kind is type(None):
        return "None"
    if kind is float:
        return "a number"
    if kind is int:
        return "an integer"
    if kind is str:
        return "a string"
    if kind is bool:
        return "True or False"
    if kind is Path:
        return "a path"
    origin = typing.get_origin(kind)
    if origin in (list, tuple, Sequence):
        return "a list of strings"
    return getattr(kind, "__name__", str(kind))


def _accepts(kind: Any, value: Any) -> bool | None:
    """Whether ``value`` is of ``kind``; None when ``kind`` is not one this module checks."""
    if kind is Any:
        return None
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is Path:
        return isinstance(value, str | os.PathLike)
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        answers = [_accepts(k, value) for k in typing.get_args(kind)]
        if any(a is True for a in answers):
            return True
        return None if any(a is None for a in answers) else False
    if origin in (list, tuple, Sequence) or kind is Sequence:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return False
        args = typing.get_args(kind)
        return all(_accepts(args[0], v) is not False for v in value) if args else True
    return None


def _plain_number(kind: Any, value: Any) -> Any:
    """A number of another library (numpy's ``int64``, ``float32``) as the Python ``int`` or
    ``float`` that ``kind`` takes; any other value as it is."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral) and _accepts(kind, int(value)) is True:
        return int(value)
    if isinstance(value, numbers.Real) and _accepts(kind, float(value)) is True:
        return float(value)
    return value


def _check_types(function: str, hints: dict[str, Any], arguments: dict[str, Any]) -> None:
    for name, value in arguments.items():
        kind = hints.get(name)
        if kind is None or _accepts(kind, value) is not False:
            continue
        options = typing.get_args(kind) or (kind,)
        wanted = " or ".join(dict.fromkeys(_type_name(k) for k in options))
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise DPLangError(f"{function}(): {name} must be {wanted}, not "
                          f"{type(value).__name__} {shown}")


def python_api(func: F) -> F:
    """Wrap an API function: unknown keywords, argument types and messages as the module
    docstring says. The wrapped function's signature and docstring are kept."""
    signature = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # pragma: no cover - an annotation that cannot be resolved: no checks
        hints = {}
    takes_extra = any(p.kind is inspect.Parameter.VAR_KEYWORD
                      for p in signature.parameters.values())
    named = [n for n, p in signature.parameters.items()
             if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not takes_extra:
            for name in kwargs:
                if name not in signature.parameters:
                    raise unknown_keyword(func.__name__, name, named)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise DPLangError(f"{func.__name__}(): {exc}") from None
        for name, value in bound.arguments.items():
            if name in hints:
                bound.arguments[name] = _plain_number(hints[name], value)
        _check_types(func.__name__, hints, {k: v for k, v in bound.arguments.items()
                                            if k in hints})
        try:
            return func(*bound.args, **bound.kwargs)
        except DPLangError as exc:
            raise DPLangError(pythonize(str(exc)), exc.code) from None

    return wrapper  # type: ignore[return-value]
