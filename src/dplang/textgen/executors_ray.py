"""Kept for earlier imports: the Ray executor is :mod:`dplang.textgen.executors.ray`."""

from .executors.ray import RayExecutor

__all__ = ["RayExecutor"]
