"""dplang.reports."""
