"""Sections of benchmarks/gpu_check.py, one concept per module."""
