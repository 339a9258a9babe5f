"""The formal lab's algorithm registry is where an algorithm's name, paper number, setting and
kind live: ``dplang formal`` reads them from it."""

from __future__ import annotations

import dataclasses

import pytest

from dplang.cli.app import main
from dplang.formal import limit, statistical
from dplang.formal import registry as reg


def test_every_algorithm_is_registered_once_with_its_paper_number():
    names = reg.algorithm_names()
    assert set(names) == set(statistical.ALGORITHMS) | set(limit.ALGORITHMS)
    assert len(names) == 12
    for name in names:
        entry = reg.get_algorithm(name)
        assert reg.resolve_algorithm(name.upper()) == name
        if entry.paper[:3].isdigit() and "·" in entry.paper:
            assert reg.resolve_algorithm(entry.paper) == name  # 000·3
            assert reg.resolve_algorithm(entry.paper.replace("·", ".")) == name  # 000.3
    assert reg.resolve_algorithm("001.c1") == "uniform-private"
    assert reg.algorithms_in("statistical", "limit") == ("uniform-private",)
    assert {n for n in names if not reg.get_algorithm(n).private} == {"margin", "pointer",
                                                                      "closure"}


def test_a_name_or_paper_number_is_taken_once():
    entry = reg.get_algorithm("soft-margin")
    with pytest.raises(ValueError, match="already registered"):
        reg.register_algorithm(entry)
    with pytest.raises(ValueError, match=r"'000\.1' is already taken"):
        reg.register_algorithm(dataclasses.replace(entry, name="another"))


def test_the_cli_reads_the_registry(capsys, monkeypatch):
    """An algorithm registered under a new name is listed and accepted by ``dplang formal``
    with no edit of the command line."""
    monkeypatch.setattr(reg, "_ALGORITHMS", dict(reg._ALGORITHMS))
    reg.register_algorithm(dataclasses.replace(reg.get_algorithm("prefix-count"),
                                               name="prefix-count-again", paper="999·1"))
    assert main(["formal", "list"]) == 0
    assert "prefix-count-again" in capsys.readouterr().out
    assert main(["formal", "run", "999.1", "--instance", "remark-5.7", "--n", "100",
                 "--epsilon", "1", "--runs", "5"]) == 0
    assert "prefix-count-again on remark-5.7, n = 100: Err = " in capsys.readouterr().out
    assert main(["formal", "run", "nosuch"]) == 2
    assert "prefix-count-again" in capsys.readouterr().err
