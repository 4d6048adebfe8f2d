"""Verification-pass attention: grouped-query attention on CPU without copying the cache.

A verification *forward pass* feeds k > 1 new tokens after a cache, so it needs a causal
mask aligned to the cache's end. Whenever a mask is present, transformers' ``sdpa``
attention repeats every key/value head for the query heads that share it (``repeat_kv``):
a copy of the layer's whole cache, in every layer, in every verification pass. With
SmolLM2-135M (9 query heads, 3 key/value heads) after a 2,000-token prompt that copy made
a pass over 8 tokens cost 2.7x one token in float32 on CPU, most of it in attention.

On CPU, torch's SDPA takes the mask and the shared heads directly (``enable_gqa=True``)
and gives bit-identical outputs. :func:`verification_attention` switches a model to that
path for the duration of one of our own forward passes; every other case (one new token,
no mask, CUDA, soft-capping, position biases) goes to transformers' own ``sdpa`` unchanged,
and nobody else's use of the model sees the switch.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

NAME = "promptlookup_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                 is_causal=None, **kwargs):
    """transformers' attention-function signature; shapes ``(batch, heads, length, head_dim)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    direct = (
        groups > 1
        and query.shape[2] > 1
        and query.device.type == "cpu"
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)
    )
    if not direct:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    attn_output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True,
    )  # (batch, heads, k, head_dim)
    return attn_output.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, grouped_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextmanager
def verification_attention(config) -> Iterator[None]:
    """Run the enclosed forward passes with :func:`grouped_sdpa` if ``config`` uses ``sdpa``."""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    _register()
    config._attn_implementation_internal = NAME
    try:
        yield
    finally:
        config._attn_implementation_internal = "sdpa"
