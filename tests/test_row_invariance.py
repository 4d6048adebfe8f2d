"""Row invariance: every row of a forward pass is computed bit for bit as a one-token pass over
the same cache computes it, op by op and for whole passes, in float32 and bfloat16, so that no
drafter, draft length or policy decision can change a token."""

from __future__ import annotations

import random

import pytest
import torch
from _fixtures import attention_path, one_thread  # noqa: F401 (fixtures)
from conftest import TinyTokenizer
from test_decoder_pass import _tiny

import promptlookup
from promptlookup.backends.gguf import row_invariant
from promptlookup.backends.gguf.row_invariant import key_length, row_invariant_attention
from promptlookup.backends.hf import target as hf_target
from promptlookup.backends.hf.target import TorchTarget

DTYPES = [torch.float32, torch.bfloat16]


def default_shaped(dtype: torch.dtype, seed: int = 0, layers: int = 2):
    """A random Llama of the default model's widths (SmolLM2-135M: 576 wide, 1536 MLP, 9
    query heads over 3 key/value heads, 49,152 tokens), with fewer layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval().to(dtype)


def one_token_rows(target: TorchTarget, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits of ``tokens`` fed one forward pass each after ``prompt``: (len(tokens), vocab)."""
    target.reset()
    target.prefill(prompt)
    return torch.cat([target.forward([token]) for token in tokens])


def random_splits(rng: random.Random, total: int, longest: int) -> list[int]:
    sizes = []
    while sum(sizes) < total:
        sizes.append(min(rng.randint(1, longest), total - sum(sizes)))
    return sizes


def split_rows(target, prompt, tokens, sizes) -> tuple[torch.Tensor, list]:
    """Logits of ``tokens`` fed in passes of ``sizes`` (each pass also run once more with a
    rejected continuation and cropped back, as a failed draft would be)."""
    target.reset()
    target.prefill(prompt)
    rows, fed = [], 0
    for size in sizes:
        length = target.cache_length
        target.forward([*tokens[fed : fed + size], *tokens[:3]])  # a longer pass, then rejected
        target.crop(length)
        rows.append(target.forward(tokens[fed : fed + size]))
        fed += size
    return torch.cat(rows), sizes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_row_of_a_pass_is_the_one_token_pass_row(
    monkeypatch, architecture, dtype, seed, attention_path
):
    # Short prompt chunks: a chunk after a cache and a waiting last chunk run in the first pass.
    monkeypatch.setattr(hf_target, "PREFILL_CHUNK", 48)
    rng = random.Random(seed)
    target = TorchTarget(_tiny(architecture, vocab_size=48, seed=seed, layers=2).to(dtype))
    assert target.row_invariant
    assert target.decoder_pass.native_attention == (attention_path == "native")
    prompt = [rng.randrange(1, 48) for _ in range(rng.randint(60, 140))]
    tokens = [rng.randrange(1, 48) for _ in range(70)]  # crosses a key block of 64
    alone = one_token_rows(target, prompt, tokens)
    together, sizes = split_rows(target, prompt, tokens, random_splits(rng, len(tokens), 17))
    assert torch.equal(together, alone), f"pass sizes {sizes}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_passes_of_the_default_models_widths_are_row_invariant(dtype, attention_path):
    target = TorchTarget(default_shaped(dtype))
    rng = random.Random(5)
    prompt = [rng.randrange(49152) for _ in range(90)]
    tokens = [rng.randrange(49152) for _ in range(24)]
    alone = one_token_rows(target, prompt, tokens)
    together, sizes = split_rows(target, prompt, tokens, [1, 16, 3, 4])
    assert torch.equal(together, alone)


def test_the_fastest_kernels_are_caught_rounding_rows_differently():
    """The harness has teeth: without row-invariant kernels (the bench's
    ``promptlookup-fastest``), rows of a pass part from one-token passes."""
    target = TorchTarget(default_shaped(torch.float32), row_invariant=False)
    assert not target.row_invariant
    rng = random.Random(5)
    prompt = [rng.randrange(49152) for _ in range(90)]
    tokens = [rng.randrange(49152) for _ in range(16)]
    alone = one_token_rows(target, prompt, tokens)
    together, _ = split_rows(target, prompt, tokens, [16])
    assert not torch.equal(together, alone)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start, rows", [(0, 1), (0, 130), (10, 16), (60, 9), (127, 2)])
def test_attention_rows_do_not_depend_on_the_rows_beside_them(dtype, start, rows):
    generator = torch.Generator().manual_seed(start + rows)
    capacity = key_length(start + rows - 1)
    keys, values = (
        torch.randn(1, 3, capacity, 64, generator=generator).to(dtype) for _ in range(2)
    )  # (1, kv_heads, capacity, head_dim)
    query = torch.randn(1, 9, rows, 64, generator=generator).to(dtype)
    together = row_invariant_attention(query, keys, values, start, 0.125, rows_alone=False)
    alone = torch.cat(
        [
            row_invariant_attention(
                query[:, :, i : i + 1], keys, values, start + i, 0.125, rows_alone=True
            )
            for i in range(rows)
        ],
        dim=1,
    )
    assert torch.equal(together, alone)
    # And it is causal attention: each row sees the keys up to its own position.
    end = start + rows
    mask = torch.ones(rows, end, dtype=torch.bool).tril(start)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(),
        keys[:, :, :end].float().repeat_interleave(3, 1),
        values[:, :, :end].float().repeat_interleave(3, 1),
        attn_mask=mask,
        scale=0.125,
    )
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(together.float(), expected.transpose(1, 2), atol=tolerance)


def test_a_machine_whose_batched_products_depend_on_their_rows_computes_rows_alone(monkeypatch):
    calls = []
    real_bmm = torch.bmm
    monkeypatch.setattr(row_invariant, "batched_rows_are_invariant", lambda *args: False)
    monkeypatch.setattr(torch, "bmm", lambda a, b: calls.append(a.shape[1]) or real_bmm(a, b))
    query, keys = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 64, 8)
    row_invariant_attention(query, keys, keys, 3, 0.3)
    assert calls == [8] * 10  # two products per row, each of one row's 2 heads padded to 8


def _lm(dtype, seed):
    model = _tiny("llama", vocab_size=32, seed=seed, layers=2).to(dtype)
    return promptlookup.from_transformers(model, TinyTokenizer(32), name="tiny")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 3])
def test_any_fixed_draft_length_gives_plain_decodings_output(dtype, seed):
    lm = _lm(dtype, seed)
    rng = random.Random(seed)
    prompt = [rng.randrange(1, 32) for _ in range(10)] * 4
    plain = lm.generate(prompt, max_new_tokens=40, drafter="none").token_ids
    drafted = 0
    for num_tokens in range(1, 17):
        result = lm.generate(prompt, max_new_tokens=40, speculation="fixed", num_tokens=num_tokens)
        assert result.token_ids == plain, f"num_tokens={num_tokens}"
        drafted += result.stats.drafted_tokens
    assert drafted > 0  # drafts were verified: the passes had many rows
    assert lm.generate(prompt, max_new_tokens=40).token_ids == plain  # adaptive too


@pytest.mark.parametrize("dtype", DTYPES)
def test_seeded_sampling_is_the_same_with_any_draft_length(dtype):
    lm = _lm(dtype, 4)
    prompt = [3, 9, 4, 7, 12, 5] * 5
    for seed in range(4):
        plain = lm.generate(
            prompt, max_new_tokens=30, drafter="none", temperature=0.8, seed=seed
        ).token_ids
        for num_tokens in (1, 4, 9):
            assert (
                lm.generate(
                    prompt,
                    max_new_tokens=30,
                    speculation="fixed",
                    num_tokens=num_tokens,
                    temperature=0.8,
                    seed=seed,
                ).token_ids
                == plain
            )


def test_row_invariant_passes_never_time_the_prompt_attention(monkeypatch):
    """The bfloat16 prompt-attention choice (blocks or sdpa) is for the fastest mode only."""
    from promptlookup.backends.inexact.attention import PromptAttention

    monkeypatch.setattr(PromptAttention, "_fastest", lambda self: pytest.fail("timed"))
    target = TorchTarget(_tiny("llama", vocab_size=48, seed=0, layers=2).to(torch.bfloat16))
    target.extend(list(range(1, 48)) * 3)  # a prompt chunk of 141 rows
    assert target.attention.choice is None
