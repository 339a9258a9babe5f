"""dplang.cli."""
