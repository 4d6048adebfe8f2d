"""Verification-pass attention: the same logits as transformers' ``sdpa``, no lasting switch."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from promptlookup.backends.attention import NAME, verification_attention
from promptlookup.backends.transformers_backend import TransformersTarget


def _verification_logits(target: TransformersTarget, prompt, draft):
    target.reset()
    target.prefill(prompt)
    return target.forward(draft)  # (len(draft), vocab)


def test_grouped_attention_gives_the_logits_of_repeated_heads(monkeypatch):
    import promptlookup.backends.transformers_backend as backend
    from contextlib import nullcontext

    model = tiny_llama(vocab_size=48, seed=3)  # 4 query heads share 2 key/value heads
    target = TransformersTarget(model)
    prompt, draft = list(range(1, 40)), [5, 9, 2, 7, 7, 1]
    sdpa, query_heads = torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, *args, **kwargs):
        query_heads.append(query.shape[1])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    grouped = _verification_logits(target, prompt, draft)
    # Prefill: transformers' own path (4 query heads); verification: folded onto 2 kv heads.
    assert query_heads == [4, 4, 2, 2]
    monkeypatch.setattr(backend, "verification_attention", lambda config: nullcontext())
    repeated = _verification_logits(target, prompt, draft)
    assert torch.allclose(grouped, repeated, atol=1e-5, rtol=0)
    assert torch.equal(grouped.argmax(-1), repeated.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_passes_match_transformers(dtype):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from promptlookup.backends.attention import grouped_sdpa

    module = torch.nn.Module()
    module.num_key_value_groups = 3
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(1, 6, 1, 8, generator=generator).to(dtype)
    key, value = (torch.randn(1, 2, 50, 8, generator=generator).to(dtype) for _ in range(2))
    ours, _ = grouped_sdpa(module, query, key, value, None, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.3)
    assert ours.shape == theirs.shape == (1, 1, 6, 8)
    assert torch.allclose(ours.float(), theirs.float(), atol=1e-2 if dtype == torch.bfloat16 else 0)


def test_switch_lasts_only_for_our_forward_pass():
    model = tiny_llama(seed=4)
    seen = []
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation))
    try:
        target = TransformersTarget(model)
        target.prefill([1, 2, 3])
        target.forward([4, 5])
    finally:
        hook.remove()
    assert seen == [NAME, NAME]
    assert model.config._attn_implementation == "sdpa"


def test_other_attention_implementations_are_left_alone():
    model = tiny_llama(seed=5)
    model.set_attn_implementation("eager")
    with verification_attention(model.config):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "eager"
