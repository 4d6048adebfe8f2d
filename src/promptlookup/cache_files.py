"""Where promptlookup keeps what it measures between runs (forward-pass cost curves, kernel
choices, converted models) and how it writes there. Every layer may import this module: it
imports nothing of the package but the version string."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

from ._version import __version__

#: The libraries whose versions key a backend's measurements: a new release of any of them may
#: change what a forward pass costs.
BACKEND_LIBRARIES = {"torch": ("torch", "transformers"), "llama.cpp": ("llama_cpp_python",)}
#: The name a backend's files keep where it differs from the backend's: the torch backend was
#: ``transformers`` before 0.15, and its measurements are found where they were.
FILE_NAMES = {"torch": "transformers"}


def cache_root() -> Path:
    """``$PROMPTLOOKUP_CACHE``, else ``$XDG_CACHE_HOME/promptlookup`` (``~/.cache/promptlookup``)."""
    if os.environ.get("PROMPTLOOKUP_CACHE"):
        return Path(os.environ["PROMPTLOOKUP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "promptlookup"


def prefix_cache_folder() -> Path:
    """Where ``promptlookup serve`` keeps its prefix cache's blocks by default
    (``--prefix-cache-dir auto``): ``prefix-cache`` in :func:`cache_root`."""
    return cache_root() / "prefix-cache"


def save_cache_json(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` in the cache, atomically (a temporary file moved into
    place); a read-only cache is not an error: it only means measuring again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two processes may save at once
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass


def cost_file_for(
    name: str, backend: str, dtype: str, device: str, threads: int | None = None, variant: str = ""
) -> Path:
    """The one place the measurement-cache key is built: the file where the forward-pass cost
    curve of this setup is kept between runs (the kernel choices are kept beside it).

    The key holds everything a pass's cost depends on: the model's ``name``, the ``backend``,
    ``dtype``, ``device`` type, the number of CPU ``threads`` (torch's current number when
    None), a backend ``variant`` (e.g. llama.cpp's batch-invariant passes), and the versions of
    promptlookup and of the backend's libraries.

    >>> cost_file_for("SmolLM2", "llama.cpp", "gguf", "cpu", 2).name    # doctest: +SKIP
    'SmolLM2-llama.cpp-gguf-cpu-2threads-v0.7.6-llama_cpp_python0.3.36.json'
    """
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    versions = [f"v{__version__}"] + [
        f"{library}{_version(library)}" for library in BACKEND_LIBRARIES.get(backend, ())
    ]
    label = FILE_NAMES.get(backend, backend)  # the backend's name in its files
    parts = [name, label, dtype, str(device).split(":")[0], f"{threads}threads"]
    key = "-".join(parts + ([variant] if variant else []) + versions)
    return cache_root() / "costs" / (key.replace("/", "_").replace("+", "_") + ".json")


def _version(library: str) -> str:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "none"
