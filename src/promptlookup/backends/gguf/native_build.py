"""Compiling the package's C kernels (``native/``) on first use.

A library's sources (one or more ``.c`` files, each its own translation unit, sharing
declarations through ``.h`` headers beside them) are compiled with the machine's C compiler
(``$CC``, else ``cc``; OpenMP, built for this CPU, without fast-math and with
``-ffp-contract=off`` so that every value is C's IEEE one) and linked into one shared library
in the cache folder, keyed by every source and header it reads, the flags, the compiler and the
CPU's features, and loaded with ``ctypes``. Where no compiler works, :func:`compiled` returns
None and the caller takes its fallback; the choice is made once per process.

The kernels' bounds are written once, in ``native/bounds.h``; :func:`bounds` reads them for
Python.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

from ...cache_files import cache_root

#: The C sources and headers.
NATIVE = Path(__file__).with_name("native")

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


@functools.cache
def bounds() -> dict[str, int]:
    """The kernels' bounds, ``native/bounds.h``'s ``#define NAME number`` lines."""
    text = (NATIVE / "bounds.h").read_text()
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)", text, re.M)}


def read_files(sources: Sequence[Path]) -> list[Path]:
    """``sources`` and the files they include with ``#include "NAME"`` (beside them),
    recursively, each once."""
    found: list[Path] = []
    for source in sources:
        if source not in found:
            found.append(source)
            included = re.findall(r'^\s*#\s*include "([^"]+)"', source.read_text(), re.M)
            found += [path for path in read_files([source.with_name(name) for name in included])
                      if path not in found]  # fmt: skip
    return found


def library_path(sources: Sequence[Path], compiler: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """Where ``sources`` (with every header they include) compiled by ``compiler`` with
    ``flags`` for this CPU and linked into one library are cached."""
    key = hashlib.sha256()
    for path in read_files(sources):
        key.update(f"{path.name}\0".encode() + path.read_bytes() + b"\0")
    for part in (" ".join(flags), compiler, cpu_features(), sys.platform):
        key.update(part.encode())
    return cache_root() / "native" / f"{sources[0].stem}-{key.hexdigest()[:16]}.so"


def compile_library(sources: Sequence[Path], compiler: str, target: Path, flags=FLAGS) -> None:
    """Compile each of ``sources`` and link them into the shared library ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        built = Path(folder) / target.name
        subprocess.run(
            [compiler, *flags, *map(str, sources), "-o", str(built), "-lm"],
            check=True,
            capture_output=True,
            timeout=180,
        )
        built.replace(target)  # atomic: another process may be building the same file


def compiled(sources: Sequence[str], switch: str, what: str, flags=FLAGS) -> ctypes.CDLL | None:
    """``sources`` (names in ``native/``) compiled, linked into one library and loaded, or
    None where it cannot be built here or the environment variable ``switch`` is 0 (``what``
    names the kernel and its fallback in the warning)."""
    if os.environ.get(switch, "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    paths = [NATIVE / name for name in sources]
    if not compiler or not all(path.exists() for path in paths):
        return None
    target = library_path(paths, compiler, flags)
    try:
        if not target.exists():
            compile_library(paths, compiler, target, flags)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:
        warnings.warn(f"{what} not built ({error})", RuntimeWarning, stacklevel=3)
        return None
