"""Our forward pass over a decoder's modules (Llama's structure): the same modules, less framework.

A forward pass of ``transformers``' ``LlamaForCausalLM`` spends a good part of its time on work
around the products: building a mask and position objects, dispatching attention through its
interface, updating the cache through its layers, output records, decorators and keyword
plumbing in every module. For a small model on a CPU that is a sizeable share (see
docs/design.md).

:class:`DecoderPass` is that pass, step by step as ``LlamaModel`` does it, calling the model's
own modules (embedding, projections, rotary embedding, head), so every weight, kernel choice
(:class:`~promptlookup.backends.gguf.linear.LinearKernels` switches the same ``nn.Linear``
modules) and RoPE variant is the model's. Only the glue is ours: the cache is our
:class:`~promptlookup.backends.hf.cache.GrowingLayer` buffers, and attention is
:func:`~promptlookup.backends.gguf.row_invariant.row_invariant_attention` (every query row computed
as a one-token pass computes it), or the inexact attention the caller gives
(:func:`~promptlookup.backends.inexact.attention.grouped_sdpa`, under
:func:`~promptlookup.backends.inexact.attention.verification_attention`, which the caller enters).

The element-wise steps (the RMS norms, applying the rotary embedding, SiLU, the residual sums)
round every value as the model's functions do, bit for bit, but write into tensors they
already have where the model makes new ones: a prompt's activations are megabytes, and each
fresh one costs page faults. Each of them, and each norm's mean over a row, computes a row
from that row alone, so with row-invariant products and attention the whole pass is
row-invariant (``tests/test_row_invariance.py`` checks it, op by op and whole).

:func:`supports` accepts only a plain ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or
``MistralForCausalLM`` (no subclasses, no sliding window) on the CPU whose every layer has the
standard structure (Llama RMS norms with weights in the activations' dtype); every other model
runs through ``model(...)`` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...errors import InvalidParameterError
from .decoder_layer import LayerModules, causal_mask
from .modules import FAMILY_TYPES
from .native_attention import PassRows, kernel_takes
from .quantized import QuantizedLinear
from .quantized_layers import QuantizedLayers

#: Architectures :class:`DecoderPass` reproduces: the class name of the whole model, and its
#: ``model_type`` (those it may be), decoder layer, attention and MLP classes (Qwen2 and Mistral are Llama's
#: layers with biases on the query/key/value projections, or none, and a sliding window, which
#: must be off).
ARCHITECTURES = {
    "LlamaForCausalLM": (("llama",), "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP"),
    "Qwen2ForCausalLM": (("qwen2",), "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP"),
    "MistralForCausalLM": (("mistral",), "MistralDecoderLayer", "MistralAttention", "MistralMLP"),
    # A GGUF's model in our own modules (backends/gguf/modules.py): the same structure, with
    # the families' parts (per-head query/key norms, norms after attention and the MLP, GELU,
    # fused weights, sliding windows, layers without RoPE, partial RoPE) taken below.
    "GgufForCausalLM": (
        ("llama", "qwen2", *FAMILY_TYPES),
        "GgufDecoderLayer",
        "GgufAttention",
        "GgufMLP",
    ),
}
#: Norm classes whose ``forward`` :func:`~promptlookup.backends.gguf.decoder_layer.rms_norm` reproduces (the four are one formula).
RMS_NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "GgufRMSNorm")


def supports(model: torch.nn.Module) -> bool:
    """Whether :class:`DecoderPass` computes ``model``'s forward pass (see the module doc)."""
    classes = ARCHITECTURES.get(type(model).__name__)
    config = model.config
    if classes is None or getattr(config, "model_type", None) not in classes[0]:
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    # Every query sees every key, except in our GGUF modules (their windows are taken here).
    ours = type(model).__name__ == "GgufForCausalLM"
    if getattr(config, "sliding_window", None) is not None and not ours:
        return False
    base = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, name) for name in needed):
        return False
    if len(base.layers) != config.num_hidden_layers:
        return False
    _, layer_class, attention_class, mlp_class = classes
    dtype = activation_dtype(model)
    return all(
        type(layer).__name__ == layer_class
        and type(layer.self_attn).__name__ == attention_class
        and type(layer.mlp).__name__ == mlp_class
        and (ours or getattr(layer.self_attn, "sliding_window", None) is None)
        and _is_rms_norm(layer.input_layernorm, dtype)
        and _is_rms_norm(layer.post_attention_layernorm, dtype)
        for layer in base.layers
    )


def activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of a model's activations: its embedding's (float32 over quantized weights)."""
    weight = getattr(model.model.embed_tokens, "weight", None)
    return torch.float32 if weight is None else weight.dtype


def _is_rms_norm(norm: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether :func:`~promptlookup.backends.gguf.decoder_layer.rms_norm` computes ``norm`` on
    activations of ``dtype``."""
    return (
        type(norm).__name__ in RMS_NORM_CLASSES
        and hasattr(norm, "variance_epsilon")
        and getattr(norm, "weight", None) is not None
        and norm.weight.dtype == dtype
    )


class DecoderPass:
    """Our forward pass of one model, its modules looked up once.

    Modules are called by their ``forward`` (an override that
    :class:`~promptlookup.backends.gguf.linear.LinearKernels` puts on an instance is found the same
    way), not through ``nn.Module.__call__``: hooks on them do not run in our passes.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        inexact_attention: Callable | None = None,
        layers_in_one_call: bool = True,
    ) -> None:
        """``inexact_attention``: the attention of a pass that need not be row-invariant
        (:func:`~promptlookup.backends.inexact.attention.grouped_sdpa`'s signature), or None
        for row-invariant attention."""
        base = model.model
        #: What attention a pass that is not row-invariant runs, or None (row-invariant).
        self.inexact_attention = inexact_attention
        #: Whether attention computes every query row as a one-token pass would.
        self.row_invariant = row_invariant = inexact_attention is None
        #: Whether row-invariant attention runs in the native kernel (one call per layer for
        #: every sequence of a pass; caches then keep their keys transposed), else per sequence
        #: over the BLAS. Fixed for the process, so every pass computes a row one way.
        attention = model.model.layers[0].self_attn
        self.native_attention = row_invariant and kernel_takes(
            model.config.num_attention_heads,
            model.config.num_key_value_heads,
            attention.head_dim,
            activation_dtype(model),
        )
        self.embed_tokens = base.embed_tokens
        #: Embeddings times this (Gemma 3), or None.
        self.embed_scale = getattr(base, "embed_scale", None)
        #: The rotary embeddings the layers take (LayerModules.rope: an index, -1 none): the
        #: model's, and Gemma 3's sliding layers' own.
        self.rotary_embs = [base.rotary_emb]
        if getattr(base, "rotary_emb_local", None) is not None:
            self.rotary_embs.append(base.rotary_emb_local)
        self.norm, self.lm_head = base.norm, model.lm_head
        self.layers = [LayerModules(layer) for layer in base.layers]
        #: Whether the weights are quantized (the quantized engine: float32 activations).
        self.quantized = type(self.layers[0].o_proj) is QuantizedLinear
        #: Every layer in one C call per pass, for a quantized model that it takes (see
        #: :mod:`~promptlookup.backends.gguf.quantized_layers`), else None: layer by layer here.
        self.quantized_layers = (
            QuantizedLayers.build(self.layers, model.config, len(self.rotary_embs))
            if self.native_attention and layers_in_one_call
            else None
        )

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, cache, logits_to_keep: int = 0) -> torch.Tensor:
        """Logits ``(1, kept, vocab)`` over ``input_ids`` (1, n) appended to ``cache`` (a cache
        of :class:`~promptlookup.backends.hf.cache.GrowingLayer`, updated in place).

        ``logits_to_keep``: the last this many positions (0: all of them), as in transformers.
        Whether a bfloat16 prompt chunk takes the blocks is
        :func:`~promptlookup.backends.inexact.attention.verification_attention`'s to say.
        """
        length = input_ids.shape[1]
        if self.row_invariant:
            return self.batch(input_ids, [cache], [length], [logits_to_keep or length])[None]
        start = cache.get_seq_length()  # tokens cached before this pass
        hidden = self.embed(input_ids)  # (1, n, hidden)
        positions = torch.arange(start, start + length, device=input_ids.device).unsqueeze(0)
        ropes = self.rotations(hidden, positions)
        # Each query sees the cache and the pass's tokens up to its own (within its window): a
        # causal mask after a cache (True: may attend), made once per pass and window.
        masks = {window: causal_mask(start, length, window) for window in self.windows}
        for layer, cache_layer in zip(self.layers, cache.layers):
            mask = masks[layer.window]
            hidden = layer.forward(
                hidden, ropes, [cache_layer], [length], mask, self.inexact_attention
            )
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.lm_head.forward(self.norm.forward(hidden))  # (1, kept, vocab)

    @torch.inference_mode()
    def batch(self, input_ids: torch.Tensor, caches, lengths, keep) -> torch.Tensor:
        """Logits ``(sum(keep), vocab)`` of one row-invariant pass over several sequences.

        ``input_ids`` (1, sum(lengths)) holds sequence i's ``lengths[i]`` new tokens after
        sequence i-1's (packed, no padding), each appended to its own cache ``caches[i]``;
        ``keep[i]``: the logits of sequence i's last this many tokens (0: none), in order.
        Every product runs over all rows at once; attention runs per sequence, each over its
        own cache. Row-invariance makes each sequence's logits those it gets alone.
        """
        device = input_ids.device
        hidden = self.embed(input_ids)  # (1, total, hidden)
        starts = [cache.get_seq_length() for cache in caches]
        positions = torch.cat(
            [torch.arange(start, start + n, device=device) for start, n in zip(starts, lengths)]
        ).unsqueeze(0)
        ropes = self.rotations(hidden, positions)
        pass_rows = PassRows(starts, lengths) if self.native_attention else None
        if self.quantized_layers is not None:
            self.quantized_layers(hidden, ropes, caches, lengths, pass_rows)
        else:
            for index, layer in enumerate(self.layers):
                cache_layers = [cache.layers[index] for cache in caches]
                hidden = layer.forward(hidden, ropes, cache_layers, lengths, None, None, pass_rows)
        ends = torch.tensor(lengths).cumsum(0).tolist()
        rows = [row for end, kept in zip(ends, keep) for row in range(end - kept, end)]
        if len(rows) != hidden.shape[1]:
            hidden = hidden[:, rows]  # (1, sum(keep), hidden)
        return self.lm_head.forward(self.norm.forward(hidden))[0]  # (sum(keep), vocab)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``input_ids`` (1, n): (1, n, hidden), scaled where the model
        scales them (as Gemma 3's embedding does: a float32 product each)."""
        hidden = self.embed_tokens.forward(input_ids)
        return hidden if self.embed_scale is None else hidden.mul_(self.embed_scale)

    def rotations(self, hidden: torch.Tensor, positions: torch.Tensor) -> list:
        """Each rotary embedding's ``(cos, sin)`` (1, n, rotated dims) at ``positions``."""
        return [rotary.forward(hidden, positions) for rotary in self.rotary_embs]

    @property
    def windows(self) -> set[int]:
        """The layers' sliding windows (0: none)."""
        return {layer.window for layer in self.layers}


#: ``kv_dtype``'s names (:func:`kv_dtype_for`, ``load_model``, ``--kv-dtype``), "auto" aside.
KV_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def kv_dtype_for(
    asked: str, decoder_pass: DecoderPass | None, dtype: torch.dtype, row_invariant: bool
) -> torch.dtype:
    """The dtype that a model's sequences cache their keys and values in, for ``kv_dtype`` =
    ``asked``: "auto" is float16 where the native kernel runs a quantized model's passes (the
    quantized engine; half of float32's memory, and attention reads half the bytes), else the
    activations' ``dtype``; "float16", "bfloat16" or "float32" as named, wherever our
    row-invariant passes run (``decoder_pass``, ``row_invariant``): each key and value is
    rounded once, as it is stored, so passes stay row-invariant. Elsewhere only the
    activations' dtype (the model's own forward reads the cache as it is)."""
    native = decoder_pass is not None and decoder_pass.native_attention
    if check_kv_dtype(asked) == "auto":
        quantized = native and decoder_pass.quantized and dtype == torch.float32
        return torch.float16 if quantized else dtype
    chosen = KV_DTYPES[asked]
    if chosen != dtype and (decoder_pass is None or not row_invariant):
        raise InvalidParameterError(
            f"kv_dtype={asked} needs promptlookup's own row-invariant passes, which this model "
            f"does not run ({str(dtype).removeprefix('torch.')} keys and values only)"
        )
    return chosen


def check_kv_dtype(asked: str) -> str:
    """``asked`` if it names a ``kv_dtype`` (:func:`kv_dtype_for`), else a named error."""
    if asked != "auto" and asked not in KV_DTYPES:
        raise InvalidParameterError(f"kv_dtype must be auto, {', '.join(KV_DTYPES)}; got {asked!r}")
    return asked
