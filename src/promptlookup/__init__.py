"""promptlookup: faster generation for language models, with exactly the same output.

>>> import promptlookup                                         # doctest: +SKIP
>>> lm = promptlookup.load_model()  # SmolLM2-135M-Instruct from PyPI, offline  # doctest: +SKIP
>>> print(lm.generate("Rewrite: ...", chat=True).text)                  # doctest: +SKIP

Importing this package loads no model and touches no file: this module only re-exports the
API from the modules that define it.
"""

from __future__ import annotations

import importlib

from ._version import __version__ as __version__

# The API is imported on first use (PEP 562): `import promptlookup` stays fast and does not
# load torch until something needs it. This table is the package's whole face (`__all__`).
_LAZY = {
    ".errors": (
        "EmptyPromptError",
        "GrammarError",
        "GrammarFailed",
        "InvalidParameterError",
        "ModelLoadError",
        "ModelNotFoundError",
        "PromptLookupError",
        "PromptTooLongError",
        "UnsupportedModelError",
    ),
    ".grammar": ("Grammar",),
    ".drafters": (
        "CallableDrafter",
        "ChainDrafter",
        "CrossRequestIndex",
        "Draft",
        "DraftModelDrafter",
        "Drafter",
        "NoDrafter",
        "PromptLookupDrafter",
        "make_drafter",
    ),
    ".generation": ("GenerationResult", "GenerationStream", "LanguageModel"),
    ".hf_generate": ("custom_generate", "make_custom_generate"),
    ".loading": ("from_transformers", "load_model"),
    ".cache_files": ("cost_file_for",),
    ".loop": ("GenerationStats", "speculative_generate"),
    ".limits": ("SamplingParams",),
    ".prefix_cache": ("PrefixCache",),
    ".sampling": ("TokenChooser",),
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}
__all__ = sorted(_LAZY_NAMES)


def __getattr__(name: str):
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES))
