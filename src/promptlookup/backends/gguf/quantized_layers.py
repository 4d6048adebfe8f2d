"""A quantized model's decoder layers in one C call per forward pass.

Over quantized weights a one-token pass of a small model is mostly not arithmetic: thirty
layers of a dozen tensor operations each, around products of a few microseconds.
``quantized_layers.c`` runs every layer of a pass (norms, products, rotary embedding, the cache
writes, attention, SiLU, residual sums) in one call, for every sequence of the pass, each row
by a fixed formula (see its header): row-invariant by construction, like the two kernels it
is made of. :class:`QuantizedLayers` describes the model to it once (pointers to the packed
weights, norms and biases, which it keeps alive) and, per pass, where each sequence's cache
is. :meth:`QuantizedLayers.build` returns None for a model it does not take (a layer that is
not quantized, a bias where the kernel has none, a non-SiLU MLP), which then runs layer by
layer in Python.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import quantized
from .native_attention import ELEMENT_TYPES, cache_pointers, kernel_takes
from .native_build import compiled

#: The library's sources: the layers, linked with the two kernels they call.
SOURCES = ["quantized_layers.c", "quantized_matmul.c", "row_attention.c"]
#: Set to 0 to run quantized models layer by layer in Python (the same kernels, slower).
ENVIRONMENT = "PROMPTLOOKUP_QUANTIZED_LAYERS"
#: Bytes of activations a pass's rows may take at a time in a model with sliding-window layers
#: (Gemma 3): a longer pass then goes through the layers in slices of at most as many rows
#: (``quantized_layers.c``'s ``slice_rows``: 64 to 512), the same bits whatever the slices. 0
#: (512-row slices, every model): 8 MiB slices saved Gemma 3 270M 18 MiB on a 2,048-token
#: prompt but ran its prefill at 0.45x (the default model's at 0.49x) on the busy 2-core host
#: (benchmarks/runs/gemma-memory-s4/prefill-speed.md), which does not pay; kept as the lever
#: (``QuantizedLayers.slice_bytes``) until a quiet machine measures it again.
SLICE_BYTES = 0


class _Linear(ctypes.Structure):
    _fields_ = [
        ("panels", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("block", ctypes.c_int32),
        ("bits", ctypes.c_int32),
        ("header", ctypes.c_int32),
        ("bias", ctypes.c_void_p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", ctypes.c_void_p),
        ("ffn_norm", ctypes.c_void_p),
        ("qkv", _Linear * 3),
        ("o", _Linear),
        ("gate_up", _Linear * 2),
        ("down", _Linear),
        ("qkv_parts", ctypes.c_int32),
        ("gate_up_parts", ctypes.c_int32),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("attn_post_norm", ctypes.c_void_p),
        ("ffn_post_norm", ctypes.c_void_p),
        ("rope", ctypes.c_int32),
        ("window", ctypes.c_int64),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int32),
        ("hidden", ctypes.c_int32),
        ("heads", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("intermediate", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("layer", ctypes.POINTER(_Layer)),
        ("rot_dim", ctypes.c_int32),
        ("ropes", ctypes.c_int32),
        ("gelu", ctypes.c_int32),
    ]


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled layers, or None where they cannot be built here."""
    library = compiled(SOURCES, ENVIRONMENT, "quantized decoder layers; running them in Python")
    if library is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    library.quantized_layers.restype = ctypes.c_int
    int_ = ctypes.c_int
    library.quantized_layers.argtypes = [p, p, i64, p, p, p, p, p, p, p, i64, int_, int_, i64]
    return library


def _linear(module, pinned: list) -> _Linear | None:
    """``module`` (a QuantizedLinear) as the kernel's struct, or None if it is not one."""
    if type(module) is not quantized.QuantizedLinear:
        return None
    weight = module.quantized
    bias = None if module.bias is None else module.bias.detach().float().contiguous()
    pinned += [weight.panels, bias]
    return _Linear(
        weight.panels.data_ptr(), weight.n, weight.k, weight.block, weight.bits, weight.header,
        None if bias is None else bias.data_ptr(),
    )  # fmt: skip


def _norm_weight(norm, eps: float, pinned: list) -> int | None:
    """The data pointer of a float32 RMS norm's weight with epsilon ``eps``, else None (0
    where there is no norm)."""
    if norm is None:
        return 0
    weight = getattr(norm, "weight", None)
    if weight is None or weight.dtype != torch.float32 or norm.variance_epsilon != eps:
        return None
    weight = weight.detach().contiguous()
    pinned.append(weight)
    return weight.data_ptr()


class QuantizedLayers:
    """Every decoder layer of one quantized model, run by ``quantized_layers.c``."""

    def __init__(self, model: _Model, pinned: list, slice_bytes: int = 0) -> None:
        self._model, self._pinned = model, pinned  # the tensors the structs point into
        #: Bytes of activations a pass's rows take at a time (0: slices of 512 rows; see
        #: :data:`SLICE_BYTES`).
        self.slice_bytes = slice_bytes

    @classmethod
    def build(cls, layers: list, config, ropes: int = 1) -> QuantizedLayers | None:
        """For ``layers`` (:class:`~promptlookup.backends.gguf.decoder_layer.LayerModules` of one
        model; ``ropes``: how many rotary embeddings its passes give), or None where some layer
        is not for the kernel (see the module doc)."""
        if not layers or type(layers[0].o_proj) is not quantized.QuantizedLinear:
            return None  # not a quantized model: nothing to compile
        if kernel() is None:
            return None
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim, eps = layers[0].head_dim, layers[0].input_layernorm.variance_epsilon
        if not kernel_takes(heads, kv_heads, head_dim, torch.float32):
            return None
        pinned: list = []
        table = (_Layer * len(layers))()
        for struct, layer in zip(table, layers):
            qkv = [layer.qkv] if layer.qkv else [layer.q_proj, layer.k_proj, layer.v_proj]
            gate_up = [layer.gate_up] if layer.gate_up else [layer.gate_proj, layer.up_proj]
            parts = [_linear(module, pinned) for module in qkv + gate_up]
            o, down = _linear(layer.o_proj, pinned), _linear(layer.down_proj, pinned)
            norms = [
                _norm_weight(norm, eps, pinned)
                for norm in (
                    layer.input_layernorm, layer.ffn_norm, layer.q_norm, layer.k_norm,
                    layer.attn_post_norm, layer.ffn_post_norm,
                )
            ]  # fmt: skip
            if None in (*parts, o, down, *norms) or layer.silu == layer.gelu:
                return None
            if o.bias or down.bias or layer.gelu != layers[0].gelu:
                return None
            struct.attn_norm, struct.ffn_norm, struct.q_norm, struct.k_norm = norms[:4]
            struct.attn_post_norm, struct.ffn_post_norm = norms[4:]
            struct.rope, struct.window = layer.rope, layer.window
            struct.o, struct.down = o, down
            struct.qkv_parts, struct.gate_up_parts = len(qkv), len(gate_up)
            for i, part in enumerate(parts[: len(qkv)]):
                struct.qkv[i] = part
            for i, part in enumerate(parts[len(qkv) :]):
                struct.gate_up[i] = part
        pinned.append(table)
        intermediate = layers[0].down_proj.in_features
        rot_dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
        model = _Model(
            len(layers), config.hidden_size, heads, kv_heads, head_dim, intermediate, eps,
            layers[0].scaling, table, rot_dim, ropes, int(layers[0].gelu),
        )  # fmt: skip
        windowed = any(layer.window for layer in layers)
        return cls(model, pinned, SLICE_BYTES if windowed else 0)

    def __call__(self, hidden, ropes: list, caches: list, lengths: list[int], pass_rows) -> None:
        """``hidden`` (1, total, hidden) through every layer, in place: sequence i's
        ``lengths[i]`` rows appended to ``caches[i]`` (their layers' buffers grown here, their
        lengths moved after the call; keys and values stored in the buffers' dtype, one for
        all). ``ropes``: each rotary embedding's (cos, sin),
        (1, total, rotated dims) each."""
        like = torch.empty(1, self._model.kv_heads, 0, self._model.head_dim)
        keys, values, capacities, dtypes = [], [], [], set()
        for index in range(self._model.layers):
            for cache, length in zip(caches, lengths):
                layer = cache.layers[index]
                layer.make_room(length, like)
                key_pointer, value_pointer, capacity = cache_pointers(layer)
                keys.append(key_pointer)
                values.append(value_pointer)
                capacities.append(capacity)
                dtypes.add(layer.value_buffer.dtype)
        if len(dtypes) != 1:
            raise ValueError(
                f"quantized decoder layers: caches of several dtypes in one pass {dtypes}"
            )
        cos = torch.cat([cos for cos, _ in ropes]).contiguous()  # (ropes, total, dims)
        sin = torch.cat([sin for _, sin in ropes]).contiguous()
        pointers = torch.tensor([keys, values, capacities], dtype=torch.int64)
        status = kernel().quantized_layers(
            ctypes.byref(self._model),
            hidden.data_ptr(),
            hidden.shape[1],
            cos.data_ptr(),
            sin.data_ptr(),
            pass_rows.row_sequence.data_ptr(),
            pass_rows.row_position.data_ptr(),
            pointers[0].data_ptr(),
            pointers[1].data_ptr(),
            pointers[2].data_ptr(),
            len(caches),
            ELEMENT_TYPES[dtypes.pop()],
            torch.get_num_threads(),
            self.slice_bytes,
        )
        if status == -2:
            raise MemoryError("quantized decoder layers: out of memory for a pass's activations")
        if status != 0:
            raise ValueError(
                "quantized decoder layers: a weight layout or attention shape the kernel does not take"
            )
        for cache, length in zip(caches, lengths):
            for layer in cache.layers:
                layer.advance(length)
