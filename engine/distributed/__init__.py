"""Tensor parallelism across processes: rank start-up, control-plane sync, and the launcher."""
