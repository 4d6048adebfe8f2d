"""The backends' names, torch-free: what ``load_model(backend=...)``, the CLI's ``--backend``
and the bench's take, and the older names still taken (the one place they are mapped)."""

from __future__ import annotations

#: ``torch``: our torch modules and C kernels over a GGUF file's quantized weights, or any
#: ``transformers`` causal LM; ``llama.cpp``: a GGUF file run by llama-cpp-python.
BACKENDS = ("torch", "llama.cpp")
DEFAULT_BACKEND = "torch"
#: Older names, each with the backend it now names: ``transformers`` was the torch backend's
#: name before 0.15 (it also runs GGUF files on our own modules).
ALIASES = {"transformers": "torch"}


def backend_name(backend: str) -> str:
    """``backend``'s current name: an older one (:data:`ALIASES`) replaced, others unchanged.

    >>> backend_name("transformers"), backend_name("llama.cpp")
    ('torch', 'llama.cpp')
    """
    return ALIASES.get(backend, backend)
