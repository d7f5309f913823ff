"""Tensor parallelism: the process group, the worker processes, rank 0's executor."""
