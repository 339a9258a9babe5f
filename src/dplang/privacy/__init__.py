"""The privacy core of dplang: guarantees, accounting, mechanisms, randomness, ledger, audits.

This package imports nothing else from dplang.
"""

from .accounting import (
    bounded_range_to_zcdp,
    calibrate_clip,
    compose_parallel,
    compose_sequential,
    dclip_sensitivity,
    epsilon_to_rho,
    exponential_mechanism_rho,
    invisibleink_rho,
    per_token_pure_epsilon,
    pure_to_zcdp,
    rho_to_delta,
    rho_to_epsilon,
    simple_rho_to_epsilon,
    topk_plus_margin,
)
from .guarantees import ADJACENCIES, Guarantee
from .randomness import RandomStreams

__all__ = [
    "ADJACENCIES",
    "Guarantee",
    "RandomStreams",
    "bounded_range_to_zcdp",
    "calibrate_clip",
    "compose_parallel",
    "compose_sequential",
    "dclip_sensitivity",
    "epsilon_to_rho",
    "exponential_mechanism_rho",
    "invisibleink_rho",
    "per_token_pure_epsilon",
    "pure_to_zcdp",
    "rho_to_delta",
    "rho_to_epsilon",
    "simple_rho_to_epsilon",
    "topk_plus_margin",
]
