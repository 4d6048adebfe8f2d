"""What this process may use of the machine."""

from __future__ import annotations

import os


def default_threads() -> int:
    """All cores this process may run on (its CPU affinity), the default thread count of the
    llama.cpp backend and of the bench."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
