"""Benchmarks of the project: `python -m benchmarks.run` (see run.py)."""
