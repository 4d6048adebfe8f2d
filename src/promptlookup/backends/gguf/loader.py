"""A causal LM whose weights are a GGUF file's, kept in the file's quantization.

:func:`load_quantized` builds the model's modules without memory (on the ``meta`` device):
our own (:mod:`~promptlookup.backends.gguf.modules`) where they reproduce the ``transformers``
model, which keeps ``transformers``' modelling code out of the process, else the
``transformers`` model. It then gives each module its tensor from the file: matrices of a
packed format (:data:`~promptlookup.backends.gguf.blocks.DECODED`) become
:class:`~promptlookup.backends.gguf.quantized.QuantizedLinear` and
:class:`~promptlookup.backends.gguf.quantized.QuantizedEmbedding` (a tied head shares the
embedding's copy), float tensors (norms, biases, float matrices) float32 parameters. The file
is read through a memory map, one tensor at a time, so loading never holds a float copy of the
model. The architectures are those :class:`~promptlookup.backends.gguf.decoder_pass.DecoderPass`
runs (Llama, Mistral, Qwen2); others raise :class:`~promptlookup.errors.UnsupportedModelError`.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from ...errors import ModelLoadError, UnsupportedModelError
from ...machine import return_freed_memory
from . import architectures as gguf_architectures
from . import modules as gguf_modules
from .blocks import DECODED
from .file import GgufFile
from .quantized import QuantizedEmbedding, QuantizedLinear, QuantizedWeight

#: GGUF tensor names -> module paths in the ``transformers`` model (``{i}``: the layer).
NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
ARCHITECTURES = ("llama", "mistral", "qwen2", *gguf_architectures.FAMILIES)
#: The tensor of llama.cpp's rotary frequency factors (Llama 3.1 and later: scaled RoPE).
ROPE_FREQS = "rope_freqs.weight"
FLOAT_KINDS = ("F32", "F16", "BF16")


def module_path(tensor_name: str, model_type: str = "llama") -> tuple[str, str]:
    """``blk.3.attn_q.weight`` -> (``model.layers.3.self_attn.q_proj``, ``weight``), with the
    names of ``model_type``'s family where they differ from Llama's."""
    stem, _, leaf = tensor_name.rpartition(".")
    layer = re.match(r"blk\.(\d+)\.", stem)
    key = stem if layer is None else stem.replace(layer.group(0), "blk.{i}.", 1)
    names = {**NAMES, **gguf_architectures.TENSORS.get(model_type, {})}
    if key not in names:
        raise UnsupportedModelError(f"GGUF tensor {tensor_name} has no place in the model")
    return names[key].format(i=layer.group(1) if layer else ""), leaf


def gguf_values(path: Path, cache_file: Path | None) -> dict:
    """The model's metadata as ``transformers``' GGUF loader reads it (``model_type`` and its
    config's keys), kept in ``cache_file``: reading it takes transformers tens of seconds."""
    if cache_file is not None and cache_file.is_file():
        values = json.loads(cache_file.read_text())
    elif (family := _own_family(path)) is not None:
        values = gguf_architectures.read_values(family, path.name)
        if cache_file is not None:
            from ...cache_files import save_cache_json

            save_cache_json(cache_file, values)
    else:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        try:
            values = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        except Exception as exc:  # truncated, corrupt or not a GGUF file
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise ModelLoadError(
                f"{path}: cannot load GGUF ({type(exc).__name__}: {reason})"
            ) from exc
        if cache_file is not None:
            from ...cache_files import save_cache_json

            save_cache_json(cache_file, values)
    values = dict(values)
    values.pop("_model_name_or_path", None)
    model_type = values.get("model_type")
    if model_type not in ARCHITECTURES and model_type not in MODEL_TYPES:
        raise UnsupportedModelError(
            f"{path.name}: architecture {model_type!r} cannot run quantized "
            f"(supported: {', '.join(ARCHITECTURES)}); load it with dtype='float32'"
        )
    return values


#: The model types of the families read by :mod:`~promptlookup.backends.gguf.architectures`.
MODEL_TYPES = tuple(gguf_architectures.FAMILIES.values())


def _own_family(path: Path):
    """The file's reader where its architecture is one of ours to read (else None: the
    ``transformers`` reader's); a recurrent one is a named error."""
    try:
        reader = GgufFile(path)
    except Exception:  # transformers' reader says what is wrong with the file
        return None
    arch = gguf_architectures.architecture(reader)
    if arch in gguf_architectures.RECURRENT:
        raise RecurrentModelError(
            f"{path.name}: architecture {arch!r} keeps recurrent state, which a rejected draft "
            "cannot roll back: not supported"
        )
    return reader if arch in gguf_architectures.FAMILIES else None


class RecurrentModelError(UnsupportedModelError):
    """A hybrid or recurrent architecture: unsupported in any dtype (no float32 fallback)."""


def empty_model(values: dict):
    """The model for ``values`` (:func:`gguf_values`) on the ``meta`` device: our own modules
    (:mod:`~promptlookup.backends.gguf.modules`) where they reproduce the ``transformers``
    model, else the ``transformers`` model."""
    values = dict(values)
    model_type = values.pop("model_type")
    if gguf_modules.takes(model_type, values):
        return gguf_modules.GgufForCausalLM(gguf_modules.gguf_config(model_type, values))
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **values)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _unpermute(rows: int, heads: int) -> np.ndarray:
    """The row order undoing llama.cpp's rotary permutation of a query or key matrix (as
    ``transformers``' GGUF loader undoes it), for ``heads`` heads."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(-1)


def load_quantized(path: str | Path, config_cache: Path | None = None):
    """The model in ``path`` (a GGUF file) with quantized weights; see the module doc.
    Returns ``(model, formats)``: ``formats`` counts the file's tensor types by module kind."""
    path = Path(path)
    values = gguf_values(path, config_cache)
    try:
        reader = GgufFile(path)
    except Exception as exc:  # truncated or not a GGUF file
        raise ModelLoadError(f"{path}: cannot read GGUF ({type(exc).__name__})") from exc
    model = empty_model(values)
    config = model.config
    permuted = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    formats: dict[str, int] = {}
    quantized: dict[str, QuantizedWeight] = {}
    factors = {}  # llama.cpp's rotary frequency factors (Llama 3's scaled RoPE, Phi-3's)
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        formats[kind] = formats.get(kind, 0) + 1
        data = tensor.data
        if tensor.name in (ROPE_FREQS, *gguf_architectures.ROPE_FACTORS):
            factors[tensor.name] = torch.from_numpy(np.asarray(data, dtype=np.float32).copy())
            continue
        where, leaf = module_path(tensor.name, config.model_type)
        # llama.cpp permutes the query and key rows of Llama-converted files (not NEOX ones).
        unpermute = config.model_type in ("llama", "smollm3")
        heads = permuted.get(where.rpartition(".")[2]) if unpermute else None
        in_file = True  # whether data's rows are the file's, in its order
        if heads and data.ndim == 2:
            data = data[_unpermute(data.shape[0], heads)]  # whole rows: exact in any format
            in_file = False
        if kind in DECODED and leaf == "weight":
            k = int(tensor.shape[0])  # GGUF shapes list the inputs first
            # each packed chunk's file pages leave the process (Gemma 3's embedding: 170 MiB)
            done = functools.partial(_forget_pages, reader, tensor) if in_file else None
            quantized[where] = QuantizedWeight.from_file(kind, data, k, done=done)
        elif kind in FLOAT_KINDS:
            values = torch.from_numpy(np.asarray(data, dtype=np.float32).copy())
            _set_parameter(model, where, leaf, values.reshape(*reversed(tensor.shape.tolist())))
        else:
            raise UnsupportedModelError(f"{path.name}: tensor {tensor.name} is {kind}, not packed")
        _forget_pages(reader, tensor)
    for where, weight in quantized.items():
        module = model.get_submodule(where)
        if isinstance(module, torch.nn.Embedding):
            _replace(model, where, QuantizedEmbedding(weight))
        else:
            bias = None if module.bias is None or module.bias.is_meta else module.bias.data
            _replace(model, where, QuantizedLinear(weight, bias))
    del reader, tensor, data  # the file's memory map goes with them
    _tie_head(model, quantized)
    base = model.model
    freq_factors = factors.get(ROPE_FREQS)
    if gguf_architectures.ROPE_FACTORS[0] in factors:  # Phi-3: long where the context is
        long = config.max_position_embeddings > config.original_max_position_embeddings
        freq_factors = factors[gguf_architectures.ROPE_FACTORS[0 if long else 1]]
    base.rotary_emb = _rotary(base.rotary_emb, config, freq_factors, path)  # on the cpu
    return_freed_memory(map_from=1 << 20)  # the packing's temporaries; see there
    missing = [name for name, value in model.state_dict().items() if value.is_meta]
    if missing:
        raise ModelLoadError(f"{path.name}: the file has no tensor for {', '.join(missing[:3])}")
    return model.eval(), formats


def _rotary(rotary: torch.nn.Module, config, freq_factors, path: Path) -> torch.nn.Module:
    """The model's rotary embedding made on the CPU, with the file's frequency factors, which
    only our own modules take (transformers' GGUF reader drops them: its Llama would rotate
    by other angles than the file's model)."""
    if isinstance(rotary, gguf_modules.GgufRotaryEmbedding):
        frequencies = rotary.inv_freq.numel()
        if freq_factors is not None and freq_factors.shape != (frequencies,):
            raise ModelLoadError(
                f"{path.name}: {ROPE_FREQS} holds {freq_factors.numel()} factors for "
                f"{frequencies} rotary frequencies"
            )
        return gguf_modules.global_rotary(config, freq_factors)
    if freq_factors is not None:
        raise UnsupportedModelError(
            f"{path.name}: {ROPE_FREQS} (scaled rotary frequencies) with this architecture's "
            "transformers classes"
        )
    return type(rotary)(config=config)


def _forget_pages(reader, tensor, rows: int | None = None) -> None:
    """Drop the file's pages of a tensor already packed (its first ``rows`` rows, else all of
    it) from this process's memory (the page cache keeps them; they would otherwise count as
    resident until the map is closed). A page the next bytes share is read again if needed."""
    import mmap

    file_map = reader.map
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = tensor.data_offset - tensor.data_offset % mmap.PAGESIZE
    n_bytes = tensor.n_bytes if rows is None else tensor.n_bytes // len(tensor.data) * rows
    end = tensor.data_offset + n_bytes
    try:
        file_map.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (OSError, ValueError):  # a platform without it: only the resident count is higher
        pass


def _tie_head(model, quantized: dict[str, QuantizedWeight]) -> None:
    """A model without an ``output`` tensor computes logits with its embedding's weights."""
    if "lm_head" in quantized:
        return
    embedding = model.model.embed_tokens
    if isinstance(embedding, QuantizedEmbedding):
        model.lm_head = QuantizedLinear(embedding.quantized)
    else:
        model.lm_head.weight = embedding.weight


def _replace(model, where: str, module: torch.nn.Module) -> None:
    parent, _, name = where.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def _set_parameter(model, where: str, leaf: str, values: torch.Tensor) -> None:
    module = model.get_submodule(where)
    setattr(module, leaf, torch.nn.Parameter(values, requires_grad=False))
