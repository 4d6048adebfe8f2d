"""The written-out Llama forward pass: the logits of the model's own, on every kind of pass."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from promptlookup.backends.gguf.decoder_pass import DecoderPass, supports
from promptlookup.backends.hf import target as hf_target
from promptlookup.backends.hf.target import TorchTarget


def _tiny(architecture: str, vocab_size: int, seed: int, layers: int, **config):
    """A tiny Llama, Qwen2 or Mistral model (random biases on Qwen2's projections)."""
    if architecture == "llama":
        return tiny_llama(vocab_size=vocab_size, seed=seed, layers=layers)
    import transformers

    config_class, model_class = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
    }[architecture]
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        sliding_window=None,
    )
    settings.update(config)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
            ):
                if projection.bias is not None:
                    projection.bias.normal_()
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def _passes(target: TorchTarget, prompt, steps) -> list[torch.Tensor]:
    """Logits of a prompt fed in chunks, then of each step (a list of tokens) in turn, some of
    them cropped away again as rejected drafts would be."""
    target.reset()
    logits = [target.extend(prompt)]
    for step in steps:
        length = target.cache_length
        logits.append(target.forward(step))
        if len(step) > 2:
            target.crop(length + 2)  # two of the step's tokens accepted
    return logits


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_written_out_passes_give_the_models_own_logits(monkeypatch, dtype, architecture):
    # Chunks of 80 tokens: a first chunk, a chunk after a cache, and a short last chunk (the
    # draft-sized path with a mask) all occur in a 200-token prompt.
    monkeypatch.setattr(hf_target, "PREFILL_CHUNK", 80)
    model = _tiny(architecture, vocab_size=48, seed=11, layers=3).to(dtype)
    written, own = TorchTarget(model), TorchTarget(model)
    own.decoder_pass = None
    assert isinstance(written.decoder_pass, DecoderPass)
    prompt = [(5 * i) % 47 + 1 for i in range(200)]
    steps = [[3], [4, 5, 6, 7], [8], list(range(1, 21)), [9, 10]]
    ours, theirs = _passes(written, prompt, steps), _passes(own, prompt, steps)
    assert written.cache_length == own.cache_length
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    for mine, reference in zip(ours, theirs):
        assert mine.shape == reference.shape
        assert torch.allclose(mine.float(), reference.float(), atol=tolerance, rtol=0)


@pytest.mark.parametrize("row_invariant", [True, False])
def test_float32_one_token_passes_keep_the_models_own_forward_only_in_the_fastest_mode(
    monkeypatch, row_invariant
):
    """Row-invariant, every pass is written out (plain steps are the same function as
    verification passes). In the fastest mode plain decoding steps in float32 keep
    transformers' own forward; every other pass is written out."""
    calls = []
    for dtype in (torch.float32, torch.bfloat16):
        target = TorchTarget(tiny_llama(seed=12).to(dtype), row_invariant=row_invariant)
        written = target.decoder_pass
        target.decoder_pass = lambda input_ids, *args, dtype=dtype, written=written: (
            calls.append((dtype, input_ids.shape[1])) or written(input_ids, *args)
        )
        target.extend([1, 2, 3])
        target.forward([4])
        target.forward([5, 6])
    one_token = [(torch.float32, 1)] if row_invariant else []
    assert calls == [
        (torch.float32, 3),
        *one_token,
        (torch.float32, 2),
        (torch.bfloat16, 3),
        (torch.bfloat16, 1),
        (torch.bfloat16, 2),
    ]


def test_bfloat16_prompt_chunks_take_the_blocks_where_they_were_timed_faster(monkeypatch):
    import promptlookup.backends.inexact.attention as attention

    calls = []
    blocked = attention.blocked_attention

    def spy(query, key, value, mask, scaling):
        calls.append((query.shape[2], key.shape[2], mask))
        return blocked(query, key, value, mask, scaling)

    monkeypatch.setattr(attention, "blocked_attention", spy)
    model = tiny_llama(vocab_size=64, seed=6).to(torch.bfloat16)
    target = TorchTarget(model, row_invariant=False)
    reference = TorchTarget(model)
    reference.decoder_pass = None
    prompt = [(7 * i) % 61 + 1 for i in range(90)]
    logits = {}
    for choice in ("blocked", "sdpa"):
        target.attention.choice = choice
        target.reset()
        target.extend(prompt)
        logits[choice] = target.extend(prompt[:70]).float()  # a chunk after a cache
    layers = model.config.num_hidden_layers
    assert calls == [(90, 90, None)] * layers + [(70, 160, None)] * layers  # "blocked" only
    reference.extend(prompt)
    expected = reference.extend(prompt[:70]).float()
    for choice in ("blocked", "sdpa"):
        assert torch.allclose(logits[choice], expected, atol=5e-2, rtol=0)


def test_only_a_plain_llama_qwen2_or_mistral_on_the_cpu_is_written_out():
    from transformers import LlamaForCausalLM

    model = tiny_llama(seed=13)
    assert supports(model)

    class Tweaked(LlamaForCausalLM):  # a subclass may compute anything
        pass

    assert not supports(Tweaked(model.config))
    flash = tiny_llama(seed=13)
    flash.config._attn_implementation_internal = "flash_attention_2"
    assert not supports(flash)
    unusual = tiny_llama(seed=13)
    unusual.model.layers[0].mlp = torch.nn.Identity()
    assert not supports(unusual)
    assert TorchTarget(unusual).decoder_pass is None
    # A sliding window hides old keys, which the written-out pass would attend to.
    assert supports(_tiny("mistral", 32, 13, 2)) and supports(_tiny("qwen2", 32, 13, 2))
    assert not supports(_tiny("mistral", 32, 13, 2, sliding_window=64))
    assert not supports(
        _tiny("qwen2", 32, 13, 2, use_sliding_window=True, sliding_window=64, max_window_layers=1)
    )


def test_hooks_and_kernel_switches_on_the_linear_modules(monkeypatch):
    """The pass calls the model's own modules by ``forward``: a kernel switch of
    :class:`~promptlookup.backends.gguf.linear.LinearKernels` applies, a forward hook does not run."""
    from promptlookup.backends.gguf.linear import LinearKernels

    monkeypatch.setattr(LinearKernels, "_fastest", lambda self, modules, rows: "weight_first")
    model = tiny_llama(seed=14).to(torch.bfloat16)
    target = TorchTarget(model)
    seen = []
    handle = model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, output: seen.append(output.shape)
    )
    switched = []
    from promptlookup.backends.gguf import linear

    first = linear.weight_first_linear
    monkeypatch.setattr(
        linear, "weight_first_linear", lambda module, x: switched.append(module) or first(module, x)
    )
    try:
        target.extend([1, 2, 3])
        target.forward([4, 5])
    finally:
        handle.remove()
    assert seen == []
    assert model.model.layers[0].self_attn.q_proj in switched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_element_wise_steps_round_as_the_models_own_functions(dtype):
    """The norm and rotary embedding written in place give the model's values bit for bit,
    and a whole pass leaves the model's weights as they were."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from promptlookup.backends.gguf.decoder_layer import rms_norm, rotary

    model = tiny_llama(seed=14).to(dtype)
    generator = torch.Generator().manual_seed(0)
    hidden = (torch.randn(1, 37, model.config.hidden_size, generator=generator) * 3).to(dtype)
    norm = model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_(generator=generator)
        expected = norm(hidden)
    before = hidden.clone()
    assert torch.equal(rms_norm(norm, hidden), expected)
    assert torch.equal(hidden, before)  # the input is not overwritten
    heads, head_dim = 4, model.config.hidden_size // 4
    query, key = (
        torch.randn(1, 37, count, head_dim, generator=generator).to(dtype).transpose(1, 2)
        for count in (heads, 2)
    )  # (1, heads, n, head_dim) views, as in the pass
    cos, sin = model.model.rotary_emb(hidden, torch.arange(5, 42)[None])  # (1, n, head_dim)
    expected_query, expected_key = apply_rotary_pos_emb(query, key, cos, sin)
    assert torch.equal(rotary(query, cos, sin), expected_query)
    assert torch.equal(rotary(key, cos, sin), expected_key)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    target = TorchTarget(model)
    target.extend([i % 31 + 1 for i in range(39)])
    target.forward([3, 4, 5])
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())


def test_a_norm_the_pass_cannot_reproduce_keeps_the_models_forward():
    model = tiny_llama(seed=15)
    model.model.layers[1].post_attention_layernorm.weight.data = model.model.layers[
        1
    ].post_attention_layernorm.weight.data.double()
    assert not supports(model)
    layer_norm = tiny_llama(seed=15)
    layer_norm.model.layers[0].input_layernorm = torch.nn.LayerNorm(layer_norm.config.hidden_size)
    assert not supports(layer_norm)
