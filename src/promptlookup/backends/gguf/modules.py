"""A GGUF's Llama or Qwen2 model in modules of our own, without ``transformers``' modelling code.

Importing ``transformers``' modelling classes costs a process about 130 MiB (its model code
pulls in ``torch.distributed.tensor``, ``sympy`` and ``torch._dynamo``, and ``scipy`` where it
is installed): more than the default model's weights. Our passes never call those classes'
``forward`` (:class:`~promptlookup.backends.gguf.decoder_pass.DecoderPass` reads their modules
and computes the pass itself), so for the configurations it runs
(:func:`takes`: Llama and Qwen2 metadata with the default rotary embedding and no sliding
window) :func:`~promptlookup.backends.gguf.loader.load_quantized` builds this module tree
instead: the same module paths, ``nn.Linear``/``nn.Embedding`` slots and attributes as
``LlamaForCausalLM``/``Qwen2ForCausalLM`` for the same config, so the loader fills it the same
way and every pass computes the same bits (``tests/test_gguf_modules.py`` checks it against
the ``transformers`` model).

What it lacks is ``model.generate``: :meth:`GgufForCausalLM.as_transformers` gives the
``transformers`` model over the same modules (no copy), for the bench's ``plain`` and
``hf-pld`` methods and for users who want ``generate``.
"""

from __future__ import annotations

import torch
from torch import nn

#: Metadata keys of a GGUF (``transformers``' reading of it) that these modules honour;
#: a file with any other key (rope scaling, a sliding window, ...) keeps ``transformers``' classes.
KNOWN_KEYS = frozenset(
    {
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
        "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
        "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
        "use_sliding_window",
    }
)  # fmt: skip
#: Defaults of ``LlamaConfig`` (and ``Qwen2Config``, where it differs) for keys a file leaves out.
DEFAULTS = {
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
}
QWEN2_DEFAULTS = {"max_position_embeddings": 32768}
#: The model types read by :mod:`~promptlookup.backends.gguf.architectures`.
FAMILY_TYPES = ("qwen3", "gemma3_text", "smollm3", "phi3")
#: Families with per-head RMS norms on queries and keys.
QK_NORMS = ("qwen3", "gemma3_text")


def takes(model_type: str, values: dict) -> bool:
    """Whether these modules reproduce ``model_type``'s ``transformers`` model for a GGUF's
    metadata ``values`` (else the loader uses ``transformers``' classes): Llama and Qwen2 as
    ``transformers`` reads them, and every family that
    :mod:`~promptlookup.backends.gguf.architectures` reads (only these modules run those)."""
    if model_type in FAMILY_TYPES:
        return True
    return (
        model_type in ("llama", "qwen2")
        and set(values) <= KNOWN_KEYS
        and values.get("hidden_act", "silu") == "silu"
        and not values.get("use_sliding_window", False)
    )


def gguf_config(model_type: str, values: dict):
    """The config of :class:`GgufForCausalLM` (a plain ``PretrainedConfig``: no model class)."""
    from transformers import PretrainedConfig

    settings = {**DEFAULTS, **(QWEN2_DEFAULTS if model_type == "qwen2" else {}), **values}
    settings.pop("use_sliding_window", None)
    linear = settings.pop("rope_scaling", None)  # gemma3's global layers: a linear factor
    settings["rope_linear_factor"] = linear["factor"] if linear else 1.0
    settings.setdefault("layer_types", None)
    heads = settings["num_attention_heads"]
    settings.setdefault("num_key_value_heads", heads)
    settings.setdefault("head_dim", settings["hidden_size"] // heads)
    if model_type == "qwen2":  # biases on the query, key and value projections only
        settings["attention_bias"] = settings["mlp_bias"] = False
    config = PretrainedConfig(**settings)
    config.model_type = model_type
    config._attn_implementation = "sdpa"  # what transformers picks on the CPU
    config.gguf_values = {"model_type": model_type, **values}  # for as_transformers
    return config


def _linear(inputs: int, outputs: int, bias: bool) -> nn.Linear:
    """An ``nn.Linear`` whose weights the loader gives (on the ``meta`` device until then)."""
    return nn.Linear(inputs, outputs, bias=bias, device="meta")


class GgufRMSNorm(nn.Module):
    """``LlamaRMSNorm``: ``weight * (x / sqrt(mean(x^2) + eps))``, in float32 then cast back."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"))
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        unrounded = hidden.to(torch.float32)
        variance = unrounded.pow(2).mean(-1, keepdim=True)
        return self.weight * (unrounded * torch.rsqrt(variance + self.variance_epsilon)).to(
            hidden.dtype
        )


class GgufRotaryEmbedding(nn.Module):
    """``LlamaRotaryEmbedding`` with the default rotary embedding: cos and sin
    ``(batch, n, dim)`` of ``positions`` (batch, n), as it computes them. ``freq_factors``
    (dim / 2): a GGUF's ``rope_freqs`` tensor (or Phi-3's long or short factors), which divides
    each frequency as llama.cpp divides it (Llama 3's scaled RoPE; ``transformers``' GGUF
    reader drops it). ``dim``: the rotated part of a head (``partial_rotary_factor``);
    ``theta``: the base (Gemma 3's sliding layers have their own); ``factor``: linear scaling
    (positions divided by it); ``attention_scaling``: cos and sin multiplied by it (Phi-3)."""

    def __init__(
        self,
        config,
        freq_factors: torch.Tensor | None = None,
        theta: float | None = None,
        factor: float = 1.0,
        attention_scaling: float = 1.0,
    ) -> None:
        super().__init__()
        dim = int(config.head_dim * getattr(config, "partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.float) / dim
        inv_freq = 1.0 / ((theta or config.rope_theta) ** exponents)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors
        if factor != 1.0:
            inv_freq = inv_freq / factor
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.attention_scaling = attention_scaling

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor):
        freqs = positions[..., None].float() * self.inv_freq.to(device=hidden.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(dtype=hidden.dtype), sin.to(dtype=hidden.dtype)


def global_rotary(config, freq_factors: torch.Tensor | None = None) -> GgufRotaryEmbedding:
    """The rotary embedding of the layers without a sliding window (all but Gemma 3's local
    ones), with a file's frequency factors."""
    return GgufRotaryEmbedding(
        config,
        freq_factors,
        factor=config.rope_linear_factor,
        attention_scaling=getattr(config, "rope_attention_factor", 1.0),
    )


class GgufAttention(nn.Module):
    """The attention's projections and the attributes our passes read (``LlamaAttention``'s)."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_key_value_groups = heads // kv_heads
        self.scaling = getattr(config, "query_pre_attn_scalar", self.head_dim) ** -0.5
        self.attention_dropout, self.is_causal = 0.0, True
        kinds = config.layer_types
        local = kinds is not None and kinds[layer_idx] == "sliding_attention"
        #: A sliding window's length, or None (every key); its layer takes the local RoPE.
        self.sliding_window = config.sliding_window if local else None
        rope = getattr(config, "no_rope_layers", None)
        self.use_rope = True if rope is None else bool(rope[layer_idx])
        qkv_bias = config.attention_bias or config.model_type == "qwen2"
        hidden, width, kv_width = (
            config.hidden_size,
            heads * self.head_dim,
            kv_heads * self.head_dim,
        )
        if config.model_type == "phi3":  # one fused weight, as the file has it
            self.qkv_proj = _linear(hidden, width + 2 * kv_width, False)
        else:
            self.q_proj = _linear(hidden, width, qkv_bias)
            self.k_proj = _linear(hidden, kv_width, qkv_bias)
            self.v_proj = _linear(hidden, kv_width, qkv_bias)
        self.o_proj = _linear(width, hidden, config.attention_bias)
        if config.model_type in QK_NORMS:
            self.q_norm = GgufRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = GgufRMSNorm(self.head_dim, config.rms_norm_eps)


class GgufMLP(nn.Module):
    """``LlamaMLP``'s products and its SiLU (Gemma 3: GELU, tanh form; Phi-3: the gate and up
    weights fused, gate first)."""

    def __init__(self, config) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        if config.model_type == "phi3":
            self.gate_up_proj = _linear(hidden, 2 * inner, bias)
        else:
            self.gate_proj = _linear(hidden, inner, bias)
            self.up_proj = _linear(hidden, inner, bias)
        self.down_proj = _linear(inner, hidden, bias)
        gelu = getattr(config, "hidden_activation", None) == "gelu_pytorch_tanh"
        self.act_fn = nn.GELU(approximate="tanh") if gelu else nn.SiLU()


class GgufDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = GgufAttention(config, layer_idx)
        self.mlp = GgufMLP(config)
        self.input_layernorm = GgufRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GgufRMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.model_type == "gemma3_text":  # post_attention_layernorm: after attention
            self.pre_feedforward_layernorm = GgufRMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = GgufRMSNorm(config.hidden_size, config.rms_norm_eps)


class GgufModel(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape, device="meta"))
        self.layers = nn.ModuleList(
            GgufDecoderLayer(config, index) for index in range(config.num_hidden_layers)
        )
        self.norm = GgufRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = global_rotary(config)
        #: Embeddings are multiplied by this (Gemma 3: sqrt(hidden) in float32), or None.
        self.embed_scale = None
        if config.model_type == "gemma3_text":
            self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32)
        if config.layer_types and "sliding_attention" in config.layer_types:
            local = getattr(config, "rope_local_base_freq", config.rope_theta)
            self.rotary_emb_local = GgufRotaryEmbedding(config, theta=local)


class GgufForCausalLM(nn.Module):
    """The module tree of ``LlamaForCausalLM`` for :func:`gguf_config`'s config, its weights on
    the ``meta`` device for the loader to give (built in a ``torch.device("meta")`` context,
    ``nn.Embedding`` would import ``torch._dynamo`` to initialise values nobody reads). It has
    no ``forward`` of its own: :class:`~promptlookup.backends.gguf.decoder_pass.DecoderPass` runs
    it."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import GenerationConfig

        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)
        self.model = GgufModel(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # the activations' (quantized weights, float32 activations)

    def as_transformers(self) -> nn.Module:
        """The ``transformers`` model (``LlamaForCausalLM``, ``Gemma3ForCausalLM``, ...) over
        these very modules, made once (it imports ``transformers``' modelling code)."""
        twin = self.__dict__.get("_transformers_twin")
        if twin is not None:
            return twin
        from .twin import transformers_twin

        twin = transformers_twin(self)
        object.__setattr__(self, "_transformers_twin", twin.eval())  # not a submodule
        return twin
