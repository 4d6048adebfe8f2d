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


def memory_bytes() -> int:
    """The machine's physical memory (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 0
