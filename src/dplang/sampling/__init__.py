"""dplang.sampling."""
