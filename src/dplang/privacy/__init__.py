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
from .guarantees import ADJACENCIES, Adjacency, Guarantee
from .randomness import RandomStreams

__all__ = [
    "ADJACENCIES",
    "Adjacency",
    "Guarantee",
    "RandomStreams",
    "bounded_range_to_zcdp",
    "compose_parallel",
    "compose_sequential",
    "epsilon_to_rho",
    "exponential_mechanism_rho",
    "pure_to_zcdp",
    "rho_to_delta",
    "rho_to_epsilon",
    "simple_rho_to_epsilon",
]
