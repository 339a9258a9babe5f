"""dplang.evaluation."""
