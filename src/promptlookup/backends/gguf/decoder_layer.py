"""One decoder layer of :class:`~promptlookup.backends.gguf.decoder_pass.DecoderPass`: its modules,
looked up once, and its pass (Llama's, with the parts of our GGUF families where a layer has
them), with the element-wise steps written to round as the model's functions round."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .native_attention import PassRows, native_attention
from .row_invariant import row_invariant_attention

#: Activation classes that are ``silu``, applied in place (others are called as they are).
SILU_CLASSES = ("SiLUActivation", "SiLU")


class LayerModules:
    """One ``LlamaDecoderLayer``'s modules, and its pass: attention then the MLP, each added to
    the residual stream (with our GGUF families' parts where the layer has them)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        config = attention.config
        self.input_layernorm = layer.input_layernorm
        # Gemma 3 names its norm after attention post_attention_layernorm, and the MLP's
        # pre_feedforward_layernorm (Llama's post_attention_layernorm).
        gemma = hasattr(layer, "pre_feedforward_layernorm")
        self.ffn_norm = layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm
        self.attn_post_norm = layer.post_attention_layernorm if gemma else None
        self.ffn_post_norm = getattr(layer, "post_feedforward_layernorm", None)
        self.q_norm = getattr(attention, "q_norm", None)  # per-head norms (Qwen3, Gemma 3)
        self.k_norm = getattr(attention, "k_norm", None)
        self.q_proj, self.k_proj, self.v_proj = (
            getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj")
        )
        self.o_proj = attention.o_proj
        self.gate_proj, self.up_proj = (
            getattr(mlp, "gate_proj", None),
            getattr(mlp, "up_proj", None),
        )
        self.down_proj = mlp.down_proj
        # SiLU (Llama's) is applied in place: the same values, no new tensor; GELU (tanh form,
        # Gemma 3's) is called as it is.
        self.silu = type(mlp.act_fn).__name__ in SILU_CLASSES
        self.gelu = getattr(mlp.act_fn, "approximate", None) == "tanh"
        self.act_fn = _silu_in_place if self.silu else mlp.act_fn
        self.attention = attention  # what inexact attention reads: is_causal, key/value groups
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        kv_width = config.num_key_value_heads * self.head_dim
        self.sizes = [config.num_attention_heads * self.head_dim, kv_width, kv_width]
        self.inner = self.down_proj.in_features
        #: The sliding window (0: none) and the rotary embedding (DecoderPass.rotary_embs'
        #: index: Gemma 3's sliding layers take the second; -1: no RoPE, SmolLM3's).
        self.window = getattr(attention, "sliding_window", None) or 0
        self.rope = (1 if self.window else 0) if getattr(attention, "use_rope", True) else -1
        # Over quantized weights, the query/key/value and the gate/up products are one kernel
        # call each (fewer calls, work for every thread); each output is computed as before.
        # Phi-3's file has them fused already.
        self.qkv = getattr(attention, "qkv_proj", None) or fused_linear(
            [self.q_proj, self.k_proj, self.v_proj]
        )
        self.gate_up = getattr(mlp, "gate_up_proj", None) or fused_linear(
            [self.gate_proj, self.up_proj]
        )

    def project(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, key and value projections of ``normed`` (1, total, hidden_size)."""
        if self.qkv is None:
            return (
                self.q_proj.forward(normed),
                self.k_proj.forward(normed),
                self.v_proj.forward(normed),
            )
        return self.qkv.forward(normed).split(self.sizes, dim=-1)

    def mlp(self, normed: torch.Tensor) -> torch.Tensor:
        """The MLP of ``normed`` (1, total, hidden_size)."""
        if self.gate_up is None:
            gate, up = self.gate_proj.forward(normed), self.up_proj.forward(normed)
        else:
            gate, up = self.gate_up.forward(normed).split(self.inner, dim=-1)
        return self.down_proj.forward(self.act_fn(gate).mul_(up))  # (1, total, hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        ropes: list,
        cache_layers: list,
        lengths: list[int],
        mask: torch.Tensor | None,
        inexact_attention: Callable | None = None,
        pass_rows: PassRows | None = None,
    ) -> torch.Tensor:
        """``hidden`` (1, total, hidden_size) after this layer, updated in place: the new tokens
        of one or more sequences, ``lengths[i]`` of them appended to ``cache_layers[i]``
        (``inexact_attention`` under ``mask``, for one sequence, where given;
        the native kernel over all of them when ``pass_rows`` describes the pass). ``ropes``:
        each rotary embedding's (cos, sin) for the pass (:meth:`DecoderPass.rotations`)."""
        total, head_dim = hidden.shape[1], self.head_dim
        normed = rms_norm(self.input_layernorm, hidden)
        # (1, total, heads * head_dim) -> (1, total, heads, head_dim), per-head norms, then
        # (1, heads, total, head_dim); likewise for keys and values
        query, key, value = (
            projected.view(1, total, -1, head_dim) for projected in self.project(normed)
        )
        if self.q_norm is not None:
            query, key = rms_norm(self.q_norm, query), rms_norm(self.k_norm, key)
        query, key, value = (states.transpose(1, 2) for states in (query, key, value))
        if self.rope >= 0:
            cos, sin = ropes[self.rope]
            query, key = rotary(query, cos, sin), rotary(key, cos, sin)
        if pass_rows is not None:  # every sequence in one call, each row over its own cache
            first = 0
            for cache_layer, length in zip(cache_layers, lengths):
                cache_layer.update(
                    key[:, :, first : first + length], value[:, :, first : first + length]
                )
                first += length
            attended = native_attention(query, cache_layers, pass_rows, self.scaling, self.window)
        elif inexact_attention is None:  # each sequence over its buffers: whole key blocks, masked
            attended, first = [], 0
            for cache_layer, length in zip(cache_layers, lengths):
                rows = slice(first, first + length)
                start = cache_layer.get_seq_length()
                cache_layer.update(key[:, :, rows], value[:, :, rows])
                attended.append(
                    row_invariant_attention(
                        query[:, :, rows],
                        cache_layer.key_buffer,
                        cache_layer.value_buffer,
                        start,
                        self.scaling,
                        window=self.window,
                    )
                )  # (1, length, heads, head_dim)
                first += length
            attended = attended[0] if len(attended) == 1 else torch.cat(attended, dim=1)
        else:
            keys, values = cache_layers[0].update(key, value)  # (1, kv_heads, start + n, d)
            keys, values = keys.to(query.dtype), values.to(query.dtype)  # a 16-bit cache's
            attended, _ = inexact_attention(
                self.attention, query, keys, values, mask, scaling=self.scaling
            )  # (1, n, heads, head_dim)
        hidden.add_(
            _post_norm(self.attn_post_norm, self.o_proj.forward(attended.reshape(1, total, -1)))
        )
        normed = rms_norm(self.ffn_norm, hidden)
        return hidden.add_(_post_norm(self.ffn_post_norm, self.mlp(normed)))


def _post_norm(norm, states: torch.Tensor) -> torch.Tensor:
    """``states`` through a norm after attention or the MLP (Gemma 3's), where there is one."""
    return states if norm is None else rms_norm(norm, states)


def causal_mask(start: int, length: int, window: int = 0) -> torch.Tensor | None:
    """(1, 1, length, start + length): True where a query of a pass of ``length`` tokens after
    ``start`` cached ones may attend (its own and earlier keys, the last ``window`` of them
    if not 0); None where that is every key up to its own (one token, or a first chunk)."""
    if (length == 1 or start == 0) and (not window or start + length <= window):
        return None
    mask = torch.ones(length, start + length, dtype=torch.bool).tril(start)
    if window:
        mask &= ~torch.ones(length, start + length, dtype=torch.bool).tril(start - window)
    return mask[None, None]


def fused_linear(modules: list[torch.nn.Module]):
    """One :class:`~promptlookup.backends.gguf.quantized.QuantizedLinear` computing ``modules``'
    outputs side by side, where all are quantized in one layout; else None."""
    from .quantized import QuantizedLinear, fused

    if not all(type(module) is QuantizedLinear for module in modules):
        return None
    weight = fused([module.quantized for module in modules])
    if weight is None:
        return None
    biases = [module.bias for module in modules]
    if all(bias is None for bias in biases):
        return QuantizedLinear(weight)
    parts = [
        torch.zeros(m.out_features) if b is None else b.detach() for m, b in zip(modules, biases)
    ]
    return QuantizedLinear(weight, torch.cat(parts))


def _silu_in_place(gate: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate, inplace=True)


def rms_norm(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``norm(hidden)`` for a Llama-style RMS norm, rounded exactly as its ``forward`` rounds,
    with two fewer fresh tensors (a prompt's activations are megabytes)."""
    unrounded = hidden.to(torch.float32)  # a copy, unless hidden is float32 already
    scale = unrounded.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()
    normed = unrounded.mul_(scale) if unrounded is not hidden else unrounded * scale
    return normed.to(hidden.dtype).mul_(norm.weight)  # weight * normed, as the model does


def rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb``'s ``states * cos + rotate_half(states) * sin`` for states
    (1, heads, n, head_dim) and cos, sin (1, n, head_dim), each product rounded as there,
    with three fewer fresh tensors. Cos and sin of fewer dims rotate the first that many
    (partial RoPE, as Phi-3's ``apply_rotary_pos_emb``), the rest kept."""
    dims = cos.shape[-1]
    if dims < states.shape[-1]:
        return torch.cat([rotary(states[..., :dims], cos, sin), states[..., dims:]], dim=-1)
    half = states.shape[-1] // 2
    rotated = torch.empty_like(states)  # rotate_half(states): (-second half, first half)
    torch.neg(states[..., half:], out=rotated[..., :half])
    rotated[..., half:] = states[..., :half]
    return rotated.mul_(sin.unsqueeze(1)).add_(states * cos.unsqueeze(1))
