"""Compiling the package's C kernels on first use.

A kernel's source is compiled with the machine's C compiler (``$CC``, else ``cc``; OpenMP,
built for this CPU, without fast-math and with ``-ffp-contract=off`` so that every value is
C's IEEE one) into the cache folder, keyed by its source, the flags, the compiler and the CPU's
features, and loaded with ``ctypes``. Where no compiler works, :func:`compiled` returns None and
the caller takes its fallback; the choice is made once per process.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from ...cache_files import cache_root

FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-std=gnu11",
    "-shared",
    "-fPIC",
)


@functools.cache
def cpu_features() -> str:
    """The CPU's feature flags (``/proc/cpuinfo``), or the platform's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def sources(source: Path) -> list[Path]:
    """``source`` and the files it includes with ``#include "NAME"`` (beside it), recursively."""
    found = [source]
    for line in source.read_text().splitlines():
        if line.startswith('#include "'):
            found += [path for path in sources(source.with_name(line.split('"')[1]))
                      if path not in found]  # fmt: skip
    return found


def library_path(source: Path, compiler: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """Where ``source`` (with what it includes) compiled by ``compiler`` with ``flags`` for
    this CPU is cached."""
    key = hashlib.sha256()
    texts = [path.read_bytes() for path in sources(source)]
    for part in (*texts, " ".join(flags), compiler, cpu_features(), sys.platform):
        key.update(part if isinstance(part, bytes) else part.encode())
    return cache_root() / "native" / f"{source.stem}-{key.hexdigest()[:16]}.so"


def compile_library(source: Path, compiler: str, target: Path, flags=FLAGS) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        built = Path(folder) / target.name
        subprocess.run(
            [compiler, *flags, str(source), "-o", str(built), "-lm"],
            check=True,
            capture_output=True,
            timeout=180,
        )
        built.replace(target)  # atomic: another process may be building the same file


def compiled(source: Path, switch: str, what: str, flags=FLAGS) -> ctypes.CDLL | None:
    """``source`` compiled and loaded, or None where it cannot be built here or the
    environment variable ``switch`` is 0 (``what`` names the kernel and its fallback in the
    warning)."""
    if os.environ.get(switch, "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler or not source.exists():
        return None
    target = library_path(source, compiler, flags)
    try:
        if not target.exists():
            compile_library(source, compiler, target, flags)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:
        warnings.warn(f"{what} not built ({error})", RuntimeWarning, stacklevel=3)
        return None
