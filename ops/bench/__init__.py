"""Benchmarks of stream-jobs against its baselines (`make bench`, `ops/bench/RESULTS.md`).

Kept free of imports: the peer scripts import this package from a venv without stream-jobs.
"""
