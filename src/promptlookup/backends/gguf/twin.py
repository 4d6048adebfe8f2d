"""The ``transformers`` model over a :class:`~promptlookup.backends.gguf.modules.GgufForCausalLM`'s
modules: its ``generate`` for the bench's ``plain`` and ``hf-pld`` methods and for users.

Every product module (quantized or not) and the embedding are shared, not copied; norm weights
are shared too, except Gemma 3's, whose file stores ``1 + w`` where ``transformers`` adds the 1
itself (the twin gets ``w`` back, a float32 difference: its passes may differ from ours in the
last bits); rotary frequencies are ours (the file's factors included). The twin runs
``transformers``' own forward: not row-invariant (see
:mod:`~promptlookup.backends.hf.target`).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


class _ScaledEmbedding(nn.Module):
    """Our embedding times Gemma 3's scale, where ``transformers`` has its scaled embedding."""

    def __init__(self, embedding: nn.Module, scale: torch.Tensor) -> None:
        super().__init__()
        self.embedding, self.scale = embedding, scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids) * self.scale


def transformers_twin(model) -> nn.Module:
    """``model``'s ``transformers`` twin (see the module doc), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # The file's token ids, or none (a config class's defaults, such as Phi-3's 32000, may be
    # past a small vocabulary).
    values = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    values.update(model.config.gguf_values)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    for name in ("_name_or_path", "gguf_formats"):
        if hasattr(model.config, name):
            setattr(config, name, getattr(model.config, name))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gemma = model.config.model_type == "gemma3_text"
    ours = dict(model.named_modules())
    for name, theirs in list(twin.named_modules()):
        mine = ours.get(name)
        if mine is None or not name:
            continue
        if isinstance(theirs, (nn.Linear, nn.Embedding)):  # products and the embedding
            parent, _, leaf = name.rpartition(".")
            shared = (
                _ScaledEmbedding(mine, model.model.embed_scale)
                if gemma and leaf == "embed_tokens"
                else mine
            )
            setattr(twin.get_submodule(parent), leaf, shared)
        elif name.endswith(("norm", "layernorm")):
            weight = mine.weight - 1 if gemma else mine.weight
            theirs.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
    rotary = type(twin.model.rotary_emb)(config=config)
    if gemma:  # one module, one table per layer type
        rotary.full_attention_inv_freq = model.model.rotary_emb.inv_freq.clone()
        if hasattr(model.model, "rotary_emb_local"):
            rotary.sliding_attention_inv_freq = model.model.rotary_emb_local.inv_freq.clone()
    else:
        rotary.inv_freq = model.model.rotary_emb.inv_freq.clone()
        rotary.original_inv_freq = rotary.inv_freq
        rotary.attention_scaling = model.model.rotary_emb.attention_scaling
    twin.model.rotary_emb = rotary
    return twin.eval()
