"""Target backends: how the decoding loop reaches the model being accelerated.

- :mod:`.base`: the :class:`Target` protocol the loop speaks.
- :mod:`.gguf`: our engine. A GGUF file read into modules of our own over its quantized
  weights, and the row-invariant pass that runs them (and ``transformers``' Llama, Qwen2 and
  Mistral modules), down to its C kernels (``gguf/native/``).
- :mod:`.hf`: the torch backend's target over a ``transformers`` causal LM (or our GGUF
  modules, which look like one): its cache, and the choice between our pass and the model's
  own forward.
- :mod:`.inexact`: kernels chosen by timing whatever their rounding, for models our pass does
  not reproduce and the bench's ``promptlookup-fastest``.
- :mod:`.llamacpp`: the target over llama.cpp.
"""

from .base import Target

__all__ = ["Target"]
