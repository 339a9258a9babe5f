"""The privacy core of dplang: guarantees, accounting, mechanisms, randomness, ledger, audits.

This package imports nothing else from dplang.
"""

from .accounting import (
    bounded_range_to_zcdp,
    compose_parallel,
    compose_sequential,
    epsilon_to_rho,
    exponential_mechanism_rho,
    pure_to_zcdp,
    rho_to_delta,
    rho_to_epsilon,
    simple_rho_to_epsilon,
)
from .calibration import CalibrationError, calibrate
from .guarantees import ADJACENCIES, Adjacency, Guarantee, GuaranteeSource
from .randomness import RandomStreams

__all__ = [
    "ADJACENCIES",
    "Adjacency",
    "CalibrationError",
    "Guarantee",
    "GuaranteeSource",
    "RandomStreams",
    "bounded_range_to_zcdp",
    "calibrate",
    "compose_parallel",
    "compose_sequential",
    "epsilon_to_rho",
    "exponential_mechanism_rho",
    "pure_to_zcdp",
    "rho_to_delta",
    "rho_to_epsilon",
    "simple_rho_to_epsilon",
]
