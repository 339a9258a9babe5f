"""Reproducible experiments: sweeps of generation + evaluation cells (``dplang experiment``)."""

from .config import Cell, ConfigError, ExperimentConfig, load_config
from .sweep import run_experiment

__all__ = ["Cell", "ConfigError", "ExperimentConfig", "load_config", "run_experiment"]
