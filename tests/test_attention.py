"""Verification-pass attention: the same logits as transformers' ``sdpa``, no lasting switch."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.backends.inexact.attention import NAME, verification_attention


def _own_forward_target(model) -> TorchTarget:
    """A target whose passes all run the model's own forward (as every model but a plain Llama
    does; a Llama's passes are written out, see test_decoder_pass.py)."""
    target = TorchTarget(model)
    target.decoder_pass = None
    return target


def _verification_logits(target: TorchTarget, prompt, draft):
    target.reset()
    target.extend(prompt)
    return target.forward(draft)  # (len(draft), vocab)


def test_grouped_attention_gives_the_logits_of_repeated_heads(monkeypatch):
    from contextlib import nullcontext

    import promptlookup.backends.hf.target as backend

    model = tiny_llama(vocab_size=48, seed=3)  # 4 query heads share 2 key/value heads
    target = _own_forward_target(model)
    prompt, draft = list(range(1, 40)), [5, 9, 2, 7, 7, 1]
    sdpa, query_heads = torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, *args, **kwargs):
        query_heads.append(query.shape[1])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    grouped = _verification_logits(target, prompt, draft)
    # Prefill: transformers' own path (4 query heads); verification: folded onto 2 kv heads.
    assert query_heads == [4, 4, 2, 2]
    monkeypatch.setattr(backend, "verification_attention", lambda config, *flags: nullcontext())
    repeated = _verification_logits(target, prompt, draft)
    assert torch.allclose(grouped, repeated, atol=1e-5, rtol=0)
    assert torch.equal(grouped.argmax(-1), repeated.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_passes_match_transformers(dtype):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from promptlookup.backends.inexact.attention import grouped_sdpa

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
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    try:
        target = _own_forward_target(model)
        target.extend([1, 2, 3])
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


def _reference_attention(query, key, value, mask):
    """float64 attention with repeated key/value heads: (1, q_len, heads, head_dim)."""
    groups = query.shape[1] // key.shape[1]
    key, value = (t.double().repeat_interleave(groups, dim=1) for t in (key, value))
    scores = query.double() @ key.transpose(-1, -2) * query.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)


@pytest.mark.parametrize(
    "q_len, kv_len, layout",
    [
        (150, 150, "causal"),  # a prompt: no mask, not a multiple of the block
        (130, 200, "causal-mask"),  # a later chunk after 70 cached tokens, causal mask given
        (100, 120, "sees-ahead"),  # a mask that lets early queries see later keys
    ],
)
def test_blocked_attention_matches_reference(q_len, kv_len, layout):
    from promptlookup.backends.inexact.attention import blocked_attention

    generator = torch.Generator().manual_seed(q_len)
    query = torch.randn(1, 6, q_len, 16, generator=generator)
    key, value = (torch.randn(1, 2, kv_len, 16, generator=generator) for _ in range(2))
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)[None, None]
    mask = causal.clone()
    if layout == "sees-ahead":
        mask[..., :5, -3:] = True  # the first queries also see the last keys
    given = None if layout == "causal" else mask
    expected = _reference_attention(query, key, value, mask)
    ours = blocked_attention(query, key, value, given, None)
    assert ours.shape == (1, q_len, 6, 16)
    assert torch.allclose(ours.double(), expected, atol=1e-5, rtol=0)
    in_bf16 = blocked_attention(query.bfloat16(), key.bfloat16(), value.bfloat16(), given, None)
    assert torch.allclose(in_bf16.double(), expected, atol=3e-2, rtol=0)


def test_bfloat16_prompt_chunks_use_blocked_attention_and_drafts_and_float32_keep_sdpa(monkeypatch):
    import promptlookup.backends.inexact.attention as attention

    calls = []
    blocked = attention.blocked_attention

    def spy(query, key, value, mask, *args):
        calls.append((query.dtype, query.shape[2], mask is None))
        return blocked(query, key, value, mask, *args)

    monkeypatch.setattr(attention, "blocked_attention", spy)
    prompt = [(7 * i) % 61 + 1 for i in range(90)]
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_llama(vocab_size=64, seed=6).to(dtype)
        target = _own_forward_target(model)
        target.attention.choice = "blocked"  # as timed on this project's AMD EPYC
        target.extend(prompt)
        logits[dtype, "draft"] = target.forward(list(range(5, 25))).float()  # 20 tokens: sdpa
        logits[dtype, "chunk"] = target.extend(prompt[:70]).float()  # a chunk after a cache
    layers = model.config.num_hidden_layers
    # The later chunk's causal mask is recognised, so its blocks skip it (mask None).
    prompt_chunk, later_chunk = (torch.bfloat16, len(prompt), True), (torch.bfloat16, 70, True)
    assert calls == [prompt_chunk] * layers + [later_chunk] * layers
    for name in ("draft", "chunk"):
        assert torch.allclose(
            logits[torch.bfloat16, name], logits[torch.float32, name], atol=0.1, rtol=0
        )


def test_bfloat16_prompt_chunks_keep_sdpa_where_it_was_timed_faster(monkeypatch):
    import promptlookup.backends.inexact.attention as attention

    calls = []
    monkeypatch.setattr(attention, "blocked_attention", lambda *args: calls.append(args))
    model = tiny_llama(vocab_size=64, seed=6).to(torch.bfloat16)
    target = TorchTarget(model)
    target.attention.choice = "sdpa"  # as timed on a Xeon with AMX
    target.extend([(7 * i) % 61 + 1 for i in range(90)])
    chunk = target.extend([(5 * i) % 61 + 1 for i in range(70)]).float()
    assert calls == [] and torch.isfinite(chunk).all()


def test_prompt_attention_is_timed_once_per_shape_and_kept_in_its_file(monkeypatch, tmp_path):
    """Timed on first need only (bfloat16 on the CPU), once per process and head shape; the
    choice lands in the cache file, which a later process reads instead of timing; a foreign
    file means timing again."""
    from types import SimpleNamespace

    import promptlookup.backends.inexact.attention as attention

    timed = []
    monkeypatch.setattr(
        attention.PromptAttention, "_fastest", lambda self: timed.append(self.shape) or "blocked"
    )
    monkeypatch.setattr(attention, "_timed_choices", {})
    config = SimpleNamespace(num_attention_heads=6, num_key_value_heads=2, hidden_size=48)
    cpu = torch.device("cpu")
    assert not attention.PromptAttention(config, torch.float32, cpu).prefers_blocks()
    assert timed == []  # float32 keeps sdpa without timing anything
    first = attention.PromptAttention(config, torch.bfloat16, cpu)
    first.use_cache_file(tmp_path / "attention.json")  # missing: timed on first need
    assert first.prefers_blocks() and first.prefers_blocks()
    assert timed == [(6, 2, 8)]
    assert attention.PromptAttention(config, torch.bfloat16, cpu).prefers_blocks()
    assert timed == [(6, 2, 8)]  # the same shape in the same process: not timed again
    monkeypatch.setattr(attention, "_timed_choices", {})  # as in a new process
    (tmp_path / "attention.json").write_text('{"bfloat16_prompt": "sdpa"}')
    later = attention.PromptAttention(config, torch.bfloat16, cpu)
    later.use_cache_file(tmp_path / "attention.json")
    assert not later.prefers_blocks() and timed == [(6, 2, 8)]
    (tmp_path / "attention.json").write_text('{"bfloat16_prompt": "flash"}')  # foreign
    foreign = attention.PromptAttention(config, torch.bfloat16, cpu)
    foreign.use_cache_file(tmp_path / "attention.json")
    assert foreign.prefers_blocks() and len(timed) == 2


def test_prompt_attention_timing_returns_a_kernel_it_knows():
    from types import SimpleNamespace

    from promptlookup.backends.inexact.attention import PromptAttention

    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    assert (
        PromptAttention(config, torch.bfloat16, torch.device("cpu"))._fastest()
        in PromptAttention.KERNELS
    )


def test_causal_masks_are_recognised_and_others_kept():
    from promptlookup.backends.inexact.attention import _is_causal

    causal = torch.ones(1, 1, 4, 10, dtype=torch.bool).tril(6)  # 4 queries after 6 cached tokens
    assert _is_causal(causal)
    sees_ahead, hides_cached = causal.clone(), causal.clone()
    sees_ahead[..., 0, 7] = True
    hides_cached[..., 2, 0] = False  # e.g. padding
    assert not _is_causal(sees_ahead) and not _is_causal(hides_cached)
    assert not _is_causal(torch.ones(1, 1, 4, 10, dtype=torch.bool).tril(5))


def test_a_pass_tiles_its_mask_once_and_a_new_mask_is_tiled_afresh(monkeypatch):
    import promptlookup.backends.inexact.attention as attention

    tilings = []
    tiled_mask = attention._tiled_mask

    def spy(mask, groups):
        tiled = tiled_mask(mask, groups)
        tilings.append(tiled)
        return tiled

    monkeypatch.setattr(attention, "_tiled_mask", spy)
    model = tiny_llama(vocab_size=48, seed=8)  # 2 layers
    target = _own_forward_target(model)
    target.extend(list(range(1, 20)))
    target.forward([3, 4, 5])
    assert len(tilings) == 2 and tilings[0] is tilings[1]
    mask = torch.ones(1, 1, 3, 6, dtype=torch.bool).tril(3)
    other = mask.clone()
    other[..., 0] = False
    assert torch.equal(tiled_mask(other, 2), other.repeat(1, 1, 2, 1))
    assert torch.equal(tiled_mask(mask, 2), mask.repeat(1, 1, 2, 1))
