import pytest

from dplang.privacy import Guarantee


def test_json_round_trip_and_summary():
    g = Guarantee("invisibleink", "reference", "replace-by-null", 1.5, 10.0, 1e-6,
                  details={"clip": 0.66})
    back = Guarantee.from_json(g.to_json())
    assert back == g and back.details == {"clip": 0.66}
    text = g.summary()
    assert "zCDP" in text and "replacing one reference by the empty reference" in text
    assert "ex ante" in text
    dd = Guarantee("adapmixed", "reference", "replace-by-null", None, 3.0, 1e-6,
                   ex_ante=False)
    text = dd.summary()
    assert "DATA-DEPENDENT" in text and "does NOT satisfy differential privacy" in text
    # a data-dependent bound is never worded as a DP guarantee
    assert "satisfies" not in text and "-differential privacy" not in text
    assert "differential privacy" in g.summary() and "satisfies" in g.summary()
    pure = Guarantee("sampler", "record", "replace-one", None, 1.0, 0.0)
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
