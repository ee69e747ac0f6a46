"""The analyses: pure functions over a Timeline (no printing, no I/O)."""
