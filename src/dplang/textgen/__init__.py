"""dplang.textgen."""
