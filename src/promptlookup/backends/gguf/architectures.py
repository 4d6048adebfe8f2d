"""The GGUF families our modules read from the file's own metadata: Qwen3, Gemma 3, SmolLM3 and
Phi-3 (Phi-4-mini is a Phi-3 file), with no ``transformers`` code at all.

:func:`read_values` turns a file's ``{arch}.*`` keys into a config's values under
``transformers``' names (so that :meth:`~promptlookup.backends.gguf.modules.GgufForCausalLM.as_transformers`
can still make the ``transformers`` model over the same modules), following what llama.cpp
reads for each family:

=========  ===============  =====================================================================
GGUF       model_type       what differs from Llama
=========  ===============  =====================================================================
qwen3      qwen3            per-head RMS norms on queries and keys (``attn_q_norm``/``attn_k_norm``)
gemma3     gemma3_text      the same norms; norms after attention and after the MLP; GELU (tanh);
                            embeddings times sqrt(hidden); sliding-window layers (``sliding_window``,
                            the pattern: ``sliding_window_pattern``, default every 6th layer global)
                            with their own RoPE base (``rope.freq_base_swa``, default 10,000);
                            linear RoPE scaling on the global layers
smollm3    smollm3          layers without RoPE: ``attention.rope_pattern`` where the file has it,
                            else every 4th layer (llama.cpp's rule); queries/keys permuted as Llama's
phi3       phi3             fused query/key/value and gate/up weights; a partial rotary dimension
                            (``rope.dimension_count``); ``rope_factors_long``/``_short`` dividing
                            the frequencies, long where the file's context exceeds
                            ``rope.scaling.original_context_length`` (llama.cpp's choice at its
                            default context), cos and sin times ``rope.scaling.attn_factor``
=========  ===============  =====================================================================

Norm weights are the file's: llama.cpp's converter stores Gemma's ``1 + w``, so every norm here
is the plain RMS norm times the file's weight. Any ``{arch}.*`` key not listed in :data:`KNOWN`
(logit soft-capping, another RoPE scaling, experts) is an
:class:`~promptlookup.errors.UnsupportedModelError`, as are hybrid and recurrent architectures
(:data:`RECURRENT`): their state cannot be rolled back after a rejected draft by cropping a
cache, and no state checkpoints are kept for them.
"""

from __future__ import annotations

from ...errors import UnsupportedModelError

#: GGUF architecture -> ``transformers``' model_type, for the families read here.
FAMILIES = {"qwen3": "qwen3", "gemma3": "gemma3_text", "smollm3": "smollm3", "phi3": "phi3"}
#: Architectures with recurrent or convolution state (hybrid or not): a named error.
RECURRENT = (
    "lfm2", "lfm2moe", "qwen3next", "mamba", "mamba2", "jamba", "falcon-h1", "granitehybrid",
    "plamo2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "nemotron_h", "nemotron_h_moe",
)  # fmt: skip
#: ``{arch}.`` keys read here (any other is a computation we do not reproduce).
KNOWN = frozenset(
    {
        "context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
        "rope.dimension_count", "attention.sliding_window", "attention.sliding_window_pattern",
        "rope.freq_base_swa", "rope.scaling.type", "rope.scaling.factor",
        "rope.scaling.original_context_length", "rope.scaling.attn_factor",
        "attention.rope_pattern", "vocab_size",
    }
)  # fmt: skip
#: Tensor names that differ from Llama's (``loader.NAMES``), per family.
TENSORS = {
    "qwen3": {
        "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
        "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    },
    "gemma3_text": {
        "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
        "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
        "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
        "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
        "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
    },
    "phi3": {
        "blk.{i}.attn_qkv": "model.layers.{i}.self_attn.qkv_proj",
        "blk.{i}.ffn_up": "model.layers.{i}.mlp.gate_up_proj",
    },
}
#: Phi-3's rotary frequency factors (one pair per file, llama.cpp's names).
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def architecture(reader) -> str:
    """The file's ``general.architecture`` (``reader``: a
    :class:`~promptlookup.backends.gguf.file.GgufFile`)."""
    return str(reader.fields.get("general.architecture", ""))


def read_values(reader, name: str) -> dict:
    """The config values (``transformers``' names) of a file of one of :data:`FAMILIES`."""
    arch = architecture(reader)
    prefix = f"{arch}."
    keys = {k[len(prefix) :]: v for k, v in reader.fields.items() if k.startswith(prefix)}
    unknown = sorted(set(keys) - KNOWN)
    if unknown:
        raise UnsupportedModelError(
            f"{name}: {arch} metadata {prefix}{unknown[0]} is not supported"
        )
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    heads = int(keys["attention.head_count"])
    head_dim = int(keys.get("attention.key_length", int(keys["embedding_length"]) // heads))
    if int(keys.get("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{name}: keys and values of different sizes")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(keys.get("vocab_size", 0)) or (
        len(tokens) if tokens is not None else int(tensors["token_embd.weight"].shape[1])
    )
    values = {
        "model_type": FAMILIES[arch],
        "vocab_size": vocab,
        "hidden_size": int(keys["embedding_length"]),
        "intermediate_size": int(keys["feed_forward_length"]),
        "num_hidden_layers": int(keys["block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(keys.get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(keys["attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(keys.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(keys["context_length"]),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in reader.fields:
            values[key] = int(reader.fields[f"tokenizer.ggml.{key}"])
    layers = values["num_hidden_layers"]
    scaling = keys.get("rope.scaling.type", "none")
    rotary = int(keys.get("rope.dimension_count", head_dim))
    if rotary != head_dim:
        values["partial_rotary_factor"] = rotary / head_dim
    if arch == "gemma3":
        window = int(keys.get("attention.sliding_window", 0))
        pattern = keys.get("attention.sliding_window_pattern", 6)
        sliding = (
            [bool(x) for x in pattern]
            if isinstance(pattern, list)
            else [pattern > 0 and (i + 1) % int(pattern) != 0 for i in range(layers)]
        )
        values["layer_types"] = [
            "sliding_attention" if window and s else "full_attention" for s in sliding
        ]
        values["sliding_window"] = window or None
        values["rope_local_base_freq"] = float(keys.get("rope.freq_base_swa", 10000.0))
        # llama.cpp's attention scale: 1/sqrt(hidden / heads) for the 27B (62 layers), else
        # 1/sqrt(head_dim) (gemma_pytorch's query_pre_attn_scalar).
        wide = values["hidden_size"] // heads if layers == 62 else head_dim
        values["query_pre_attn_scalar"] = wide
        values["hidden_activation"] = "gelu_pytorch_tanh"
        if scaling == "linear":
            factor = float(keys["rope.scaling.factor"])
            values["rope_scaling"] = {"rope_type": "linear", "factor": factor}
            scaling = "none"
    if arch == "smollm3":
        pattern = keys.get("attention.rope_pattern")
        uses = [bool(x) for x in pattern] if pattern else [(i + 1) % 4 != 0 for i in range(layers)]
        values["no_rope_layers"] = [int(x) for x in uses]
    if arch == "phi3":
        original = int(keys.get("rope.scaling.original_context_length", 0))
        values["original_max_position_embeddings"] = original or values["max_position_embeddings"]
        values["rope_attention_factor"] = float(keys.get("rope.scaling.attn_factor", 1.0))
        if scaling in ("longrope", "su", "yarn") and ROPE_FACTORS[0] in tensors:
            scaling = "none"  # the factors tensors carry it
    if scaling not in ("none", ""):
        raise UnsupportedModelError(f"{name}: {arch} with RoPE scaling {scaling!r}")
    return values
