"""Task states and which of them hold a backlog slot or an execution permit."""

from __future__ import annotations

WAITING = "WAITING"
LEASED = "LEASED"
RUNNING = "RUNNING"
NEEDS_REVIEW = "NEEDS_REVIEW"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"

ALL_STATES = (WAITING, LEASED, RUNNING, NEEDS_REVIEW, SUCCEEDED, FAILED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
UNFINISHED = frozenset({WAITING, LEASED, RUNNING, NEEDS_REVIEW})
HOLDS_PERMIT = frozenset({LEASED, RUNNING})


def is_terminal(state: str) -> bool:
    return state in TERMINAL
