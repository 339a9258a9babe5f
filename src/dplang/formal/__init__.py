"""dplang.formal."""
