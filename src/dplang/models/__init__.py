"""dplang.models."""
