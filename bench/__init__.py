"""Benchmarks: runnable scripts that print figures (never timed assertions in tests)."""
