import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.evaluation.stats import Z_99, difference_interval, wald_interval


def test_wald_interval_known_data():
    # values 1..5: mean 3, sample std sqrt(2.5), m = 5
    iv = wald_interval([1, 2, 3, 4, 5])
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.std == pytest.approx(math.sqrt(2.5))
    assert iv.half_width == pytest.approx(2.576 * math.sqrt(2.5) / math.sqrt(5))
    assert iv.half_width == pytest.approx(1.8215, abs=1e-4)
    assert (iv.low, iv.high) == pytest.approx((3 - 1.8215, 3 + 1.8215), abs=1e-4)
    assert iv.format(2) == "3.00 ± 1.82"


def test_wald_interval_constant_and_tiny_samples():
    assert wald_interval([7.0] * 10).half_width == 0.0
    one = wald_interval([4.0])
    assert one.mean == 4.0 and math.isnan(one.half_width)
    assert one.to_dict()["half_width"] is None and one.format() == "4.00 ± n/a"
    empty = wald_interval([])
    assert empty.n == 0 and empty.to_dict()["mean"] is None
    with pytest.raises(ValueError):
        wald_interval([1.0, float("nan")])


def test_difference_interval_known_data():
    a = wald_interval([10, 12, 14])  # mean 12, s = 2
    b = wald_interval([1, 2, 3, 4])  # mean 2.5, s^2 = 5/3
    d = difference_interval(a, b)
    assert d.mean == pytest.approx(9.5)
    assert d.half_width == pytest.approx(Z_99 * math.sqrt(4 / 3 + (5 / 3) / 4))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=50))
def test_wald_interval_matches_numpy(values):
    iv = wald_interval(values)
    x = np.asarray(values)
    assert iv.mean == pytest.approx(x.mean(), abs=1e-9)
    assert iv.half_width == pytest.approx(2.576 * x.std(ddof=1) / math.sqrt(x.size), abs=1e-9)
    assert iv.low <= iv.mean <= iv.high
