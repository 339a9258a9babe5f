"""The exact Gaussian privacy profile δ(ε) (Balle & Wang 2018) in dplang.privacy.audit."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from dplang.privacy.audit import gaussian_privacy_profile


@pytest.mark.parametrize(("sigma", "eps"), [(2.0, 1.0), (1.0, 0.5), (5.0, 0.1), (0.7, 3.0)])
def test_matches_dp_accounting(sigma, eps):
    ref = pld.from_gaussian_mechanism(standard_deviation=sigma, sensitivity=1.0)
    assert gaussian_privacy_profile(eps, 1 / sigma) == pytest.approx(
        ref.get_delta_for_epsilon(eps), rel=1e-3)


def test_classical_calibration_is_below_target_and_half_sigma_is_not():
    for eps, delta in ((0.5, 1e-6), (0.9, 1e-5)):
        sigma = math.sqrt(2 * math.log(1.25 / delta)) / eps
        assert gaussian_privacy_profile(eps, 1 / sigma) <= delta
        assert gaussian_privacy_profile(eps, 2 / sigma) > delta


def test_edge_cases():
    assert gaussian_privacy_profile(1.0, 0.0) == 0.0
    assert gaussian_privacy_profile(0.0, 1.0) == pytest.approx(2 * 0.19146246, rel=1e-6)
    assert 0 <= gaussian_privacy_profile(50.0, 1.0) < 1e-100
    with pytest.raises(ValueError):
        gaussian_privacy_profile(-1.0, 1.0)
