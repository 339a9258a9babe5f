"""Guarantee: its named constructors (the one way dplang builds one), text and JSON."""

import ast
import math
from pathlib import Path

import pytest

from dplang.privacy import Guarantee, rho_to_epsilon

SRC = Path(__file__).resolve().parents[2] / "src" / "dplang"


def test_json_round_trip_and_summary():
    g = Guarantee.zcdp("invisibleink", "reference", "replace-by-null", 1.5, 1e-6, epsilon=10.0,
                       details={"clip": 0.66})
    back = Guarantee.from_json(g.to_json())
    assert back == g and back.details == {"clip": 0.66}
    text = g.summary()
    assert "zCDP" in text and "replacing one reference by the empty reference" in text
    assert "ex ante" in text
    dd = Guarantee.data_dependent("adapmixed", "reference", "replace-by-null", 3.0, 1e-6)
    text = dd.summary()
    assert "DATA-DEPENDENT" in text and "does NOT satisfy differential privacy" in text
    # a data-dependent bound is never worded as a DP guarantee
    assert "satisfies" not in text and "-differential privacy" not in text
    assert "differential privacy" in g.summary() and "satisfies" in g.summary()
    pure = Guarantee.pure("sampler", "record", "replace-one", 1.0)
    assert pure.is_pure and "pure 1-differential privacy" in pure.summary()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"adjacency": "bogus"},
        {"rho": -1.0},
        {"epsilon": -0.1},
        {"delta": 1.0},
    ],
)
def test_validation(kwargs):
    base = {"mechanism": "m", "unit": "reference", "adjacency": "replace-by-null",
            "rho": 1.0, "epsilon": 1.0, "delta": 1e-6}
    base.update(kwargs)
    with pytest.raises(ValueError):
        Guarantee(**base)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown"):
        Guarantee.from_dict({"mechanism": "m", "unit": "u", "adjacency": "zero-out",
                             "rho": None, "epsilon": 1, "delta": 0, "extra": 1})


@pytest.mark.audits("accounting")
def test_named_constructors():
    z = Guarantee.zcdp("m", "reference", "replace-by-null", 0.5, 1e-6, details={"c": 1})
    assert (z.rho, z.epsilon, z.delta) == (0.5, rho_to_epsilon(0.5, 1e-6), 1e-6)
    assert z.details == {"c": 1} and z.ex_ante and z.is_dp
    assert Guarantee.zcdp("public", "reference", "replace-by-null", 0.0, 0.0).epsilon == 0.0
    target = Guarantee.zcdp("m", "reference", "replace-by-null", 0.5, 1e-6, epsilon=6.0)
    assert target.epsilon == 6.0 and target.rho == 0.5
    # a target ε that ρ does not imply is refused, never printed
    with pytest.raises(ValueError, match="does not imply"):
        Guarantee.zcdp("m", "reference", "replace-by-null", 0.5, 1e-6,
                       epsilon=rho_to_epsilon(0.5, 1e-6) * (1 - 1e-6))
    pure = Guarantee.pure("m", "record", "replace-one", 2.0)
    assert (pure.rho, pure.epsilon, pure.delta) == (None, 2.0, 0.0) and pure.is_pure
    approx = Guarantee.approximate("m", "record", "replace-one", 1.0, 1e-7)
    assert (approx.rho, approx.epsilon, approx.delta) == (None, 1.0, 1e-7)
    dd = Guarantee.data_dependent("m", "reference", "add-remove", 3.0, 1e-6)
    assert not dd.ex_ante and not dd.is_dp and dd.rho is None
    none = Guarantee.non_private("m", "record", "replace-one", details={"why": "baseline"})
    assert math.isinf(none.epsilon) and none.details == {"private": False, "why": "baseline"}
    # not DP: a ledger keeps it out of every DP total, and its summary says NOT PRIVATE
    assert not none.ex_ante and not none.is_dp and "NOT PRIVATE" in none.summary()
    assert pure.as_toy().public_seed and not pure.as_toy().is_dp


def _calls_and_defs():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            yield path.relative_to(SRC).as_posix(), node


def test_no_guarantee_is_built_field_by_field():
    """Every Guarantee in src/dplang comes from a named constructor (or ``replace``/
    ``from_dict``): a positional ``Guarantee(...)`` call is what let each mechanism convert
    ρ → ε its own way."""
    raw = [f"{path}:{node.lineno}" for path, node in _calls_and_defs()
           if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
           and node.func.id == "Guarantee"]
    assert raw == []


def test_every_guarantee_method_has_the_one_signature():
    """guarantee(self, n=None, d=None) on every params object, sampler, algorithm and report
    mechanism (properties of plans excepted): callers never ask which kind they hold."""
    seen, wrong = 0, []
    for path, node in _calls_and_defs():
        if not (isinstance(node, ast.FunctionDef) and node.name == "guarantee"):
            continue
        if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            continue
        seen += 1
        args = node.args
        shape = ([a.arg for a in args.args], [ast.unparse(d) for d in args.defaults],
                 [ast.unparse(a.annotation) for a in args.args[1:]], args.kwonlyargs,
                 args.vararg, args.kwarg)
        if shape != (["self", "n", "d"], ["None", "None"], ["int | None", "int | None"], [],
                     None, None):
            wrong.append(f"{path}:{node.lineno}")
    assert seen > 30 and wrong == []


def test_a_guarantee_that_depends_on_n_refuses_none():
    from dplang.formal.statistical import SoftMarginIdentifier
    from dplang.reports.freetext import InvisibleInkReport
    from dplang.sampling.kary import RevealOrObscureSampler

    with pytest.raises(ValueError, match="n must be"):
        RevealOrObscureSampler(3, 1.0).guarantee()
    with pytest.raises(ValueError, match="needs n"):
        InvisibleInkReport(model=None, epsilon=1.0).guarantee()
    assert RevealOrObscureSampler(3, 1.0).guarantee(10).epsilon == 1.0
    # one that does not depend on n ignores it
    assert SoftMarginIdentifier(epsilon=0.5).guarantee() == SoftMarginIdentifier(
        epsilon=0.5).guarantee(7)
