"""Interlock's own benchmarks: `python -m bench.cycle`, `python -m bench.growth` (see README.md)."""
