"""Benchmarks of the template: `python -m benchmarks.run` (see run.py)."""
