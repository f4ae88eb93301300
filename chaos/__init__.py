"""Chaos runs: Orbit nodes, workers and MariaDB under faults, then checked end to end.

    python -m chaos --seconds 600          # the documented long run
    python -m chaos --seconds 120 --seed 7 # what CI runs (tests/chaos)

See `run.py` for the phases and `checks.py` for what a run must leave behind.
"""
