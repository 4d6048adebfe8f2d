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


#: glibc's ``mallopt`` parameter for the size from which blocks get a map of their own.
M_MMAP_THRESHOLD = -3


def return_freed_memory(map_from: int | None = None, collect: bool = True) -> None:
    """Give memory this process freed back to the system (glibc keeps freed heap memory
    unless asked); with ``map_from``, serve blocks of that many bytes or more from their own
    maps from now on, so that freeing them returns them too (glibc's default threshold grows
    up to 32 MiB as such blocks are freed, and the heap then keeps the largest request's
    memory). ``collect``: Python's garbage collected first (cycles hold memory too; tens of
    milliseconds with a large heap of objects). A no-op where the C library is not glibc."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        if map_from is not None:
            libc.mallopt(M_MMAP_THRESHOLD, map_from)
    except (OSError, AttributeError):  # not glibc: nothing to ask
        pass
