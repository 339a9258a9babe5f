"""Reproducible experiments: sweeps of generation + evaluation cells (``dplang experiment``),
and the canary run (:mod:`dplang.experiments.canary_run`, ``dplang evaluate canaries``)."""

from .config import Cell, ConfigError, ExperimentConfig, load_config
from .sweep import run_experiment

__all__ = ["Cell", "ConfigError", "ExperimentConfig", "load_config", "run_experiment"]
