"""Attention for our forward passes on CPU: grouped-query attention without copies or slow paths.

SmolLM2-135M, like most recent models, shares each key/value head among several query heads
(9 query heads, 3 key/value heads). Two cases are slow in transformers' ``sdpa`` attention
on CPU (torch 2.13, measured after a 2,000-token prompt, one thread):

- A verification *forward pass* feeds k > 1 tokens after a cache, so it needs a causal mask
  aligned to the cache's end; with a mask, transformers repeats every key/value head for its
  query heads (``repeat_kv``): a copy of the layer's whole cache, in every layer, every pass.
  That made a pass over 8 tokens cost 2.3x one token in float32.
- A one-token pass in bfloat16 goes to a grouped-query kernel that took 2.6 ms per layer,
  6x the same attention computed with the heads folded as below.

:func:`grouped_sdpa` folds each key/value head's query heads into the query-length axis,
``(batch, heads, k, head_dim) -> (batch, kv_heads, groups * k, head_dim)``, with the mask
tiled to match, and runs plain SDPA on the unrepeated cache: the same attention, row by row.
Float32 one-token passes keep transformers' own path, so plain steps stay bit-identical to
plain decoding. :func:`verification_attention` switches a model to this function for the
duration of our own forward passes only; every other case (CUDA, soft-capping, position
biases, float masks) goes to transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator

import torch

NAME = "promptlookup_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                 is_causal=None, **kwargs):
    """transformers' attention-function signature; shapes ``(batch, heads, length, head_dim)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if q_len == 1:
        folds = query.dtype != torch.float32
    else:  # without a mask (a prefill) transformers runs causal grouped attention already
        folds = attention_mask is not None
    folds = (
        folds
        and groups > 1
        and heads == groups * kv_heads
        and query.device.type == "cpu"
        and (attention_mask is None
             or (attention_mask.dtype == torch.bool and attention_mask.dim() == 4
                 and attention_mask.shape[1] == 1))
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)
    )
    if not folds:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # Rows ordered (query head within its group, position), matching the tiled mask.
    folded_query = query.reshape(batch, kv_heads, groups * q_len, head_dim)
    folded_mask = None if attention_mask is None else attention_mask.repeat(1, 1, groups, 1)
    attn_output = torch.nn.functional.scaled_dot_product_attention(
        folded_query, key, value, attn_mask=folded_mask, dropout_p=dropout, scale=scaling,
    )  # (batch, kv_heads, groups * q_len, head_dim)
    attn_output = attn_output.reshape(batch, heads, q_len, head_dim)
    return attn_output.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    """Make :data:`NAME` known to transformers (once per process, on first use)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

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
