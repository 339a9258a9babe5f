"""Issue 35 §4: the Python API refuses wrong types by name (booleans are not numbers), speaks
Python in its messages (keywords, not flags; ``data``, not a temporary path), and suggests the
keyword a typo meant. Nothing runs, is charged or written on a refusal."""

from __future__ import annotations

import pytest

import dplang
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger

TEXTS = [f"review number {i} was fine" for i in range(12)]


@pytest.fixture
def toy():
    return ToyModel(vocab_size=30, eos_after=None)


def _gen(toy, **kw):
    args = {"epsilon": 3, "dataset": "p", "model": toy, "batch_size": 3, "max_tokens": 2,
            "quiet": True, **kw}
    return dplang.generate(TEXTS, **args)


@pytest.mark.parametrize(("call", "needle"), [
    (lambda t: dplang.account(epsilon=3, tokens="64"),
     "account(): tokens must be an integer, not str '64'"),
    (lambda t: dplang.account(epsilon=True), "epsilon must be a number or None, not bool"),
    (lambda t: dplang.account(epsilon=[3]), "epsilon must be a number or None, not list"),
    (lambda t: dplang.account(epsilon=3, tokenz=64), "'tokenz'; did you mean tokens?"),
    (lambda t: _gen(t, dataset=123), "dataset must be a string or None, not int 123"),
    (lambda t: _gen(t, epsilon=True), "epsilon must be a number or None, not bool"),
    (lambda t: _gen(t, ledger=123), "ledger must be a string or a path or None, not int"),
    (lambda t: _gen(t, seed=1.5), "seed must be an integer or None, not float"),
    (lambda t: _gen(t, max_token=4), "'max_token'; did you mean max_tokens?"),
    (lambda t: _gen(t, sigma=0.3), "sigma= is an option of method amin"),
    (lambda t: _gen(t, num=0), "num must be >= 1, got 0"),
    (lambda t: _gen(t, method="amin", sigma=-1), "sigma must be finite and > 0"),
    (lambda t: dplang.report(TEXTS, epsilon="3", threshold=0.5, dataset="r", statements=["a"]),
     "epsilon must be a number"),
    (lambda t: dplang.sample([{"a": 1}], columns="a", epsilon=1, dataset="s", num=True),
     "num must be an integer"),
])
def test_wrong_input_is_one_pythonic_error(toy, call, needle):
    with pytest.raises(dplang.DPLangError) as info:
        call(toy)
    message = str(info.value)
    assert needle in message and "\n" not in message, message
    assert "--" not in message  # no flag of the command line
    assert info.value.code == 2
    assert not PrivacyLedger().datasets()


def test_in_memory_data_is_named_data_not_a_temporary_path(toy):
    with pytest.raises(dplang.DPLangError) as info:
        dplang.generate([], epsilon=3, dataset="empty", model=toy, quiet=True)
    message = str(info.value)
    assert message.startswith("data: ") and "/tmp" not in message and ".arrow" not in message


def test_flags_become_keywords():
    from dplang.api.params import pythonize

    assert pythonize("--max-tokens must be >= 1") == "max_tokens must be >= 1"
    assert pythonize("give exactly one of --epsilon, --rho or --clip") == \
        "give exactly one of epsilon, rho or clip"
    assert pythonize("--amin-sigma must be > 0") == "sigma must be > 0"
