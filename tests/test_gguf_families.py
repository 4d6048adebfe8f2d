"""Qwen3, Gemma 3, SmolLM3 and Phi-3 GGUFs in the quantized engine: tiny random-weight files
written here with the ``gguf`` package, as llama.cpp's converter lays each family out, load into
our modules from their own metadata and pass Llama's exactness tests: every row of every pass
is a one-token pass's row (any row count, thread count, C or Python layers, sliding windows
far behind, rejected drafts cropped), drafting and batching never change a greedy or seeded
sampled token, and ``as_transformers()`` computes the same model."""

from __future__ import annotations

import random

import gguf
import numpy as np
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from conftest import TinyTokenizer
from test_gguf_architectures import write_bare_gguf
from test_quantized import HALVES, random_tensor
from test_quantized_layers import assert_sequences_get_their_own_rows

import promptlookup
from promptlookup.backends.gguf import quantized, quantized_layers
from promptlookup.backends.gguf.loader import RecurrentModelError, load_quantized
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.errors import UnsupportedModelError

pytestmark = pytest.mark.skipif(not quantized.available(), reason="no C compiler here")
T = gguf.GGMLQuantizationType
VOCAB, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 256, 256, 4, 2, 32, 4
WINDOW = 8  #: Gemma 3's sliding window here: far shorter than the prompts
FAMILIES = ["qwen3", "gemma3", "smollm3", "phi3"]


def write_family(path, arch: str, seed: int = 0, **metadata) -> None:
    """A random tiny ``arch`` model as a GGUF file (Q8_0/Q4_K/Q6_K/Q5_0 matrices: the formats
    of real files of these families), with ``metadata`` (``{arch}.``-less keys) added."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if arch == "gemma3":
        writer.add_sliding_window(WINDOW)
        writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)  # odd layers global
    if arch == "phi3":
        writer.add_rope_dimension_count(HEAD_DIM * 3 // 4)  # partial, as Phi-4-mini's
        writer.add_uint32("phi3.rope.scaling.original_context_length", 1024)
        writer.add_float32("phi3.rope.scaling.attn_factor", 1.19)
    for key, value in metadata.items():
        writer.add_key_value(f"{arch}.{key}", value, gguf.GGUFValueType.get_type(value))

    def matrix(name: str, rows: int, cols: int, kind=T.Q8_0, scale: float = 0.1) -> None:
        if kind in (T.Q4_K, T.Q6_K):  # gguf cannot quantize to these: random blocks
            raw = random_tensor(kind.name, rows, cols, int(rng.integers(1 << 30)))
            size, nbytes = gguf.GGML_QUANT_SIZES[kind]
            blocks = raw.reshape(rows, cols // size, nbytes)
            for offset in HALVES[kind.name]:  # small scales: weights of about 0.1
                half = blocks[..., offset : offset + 2].copy().view(np.float16)
                blocks[..., offset : offset + 2] = (half * np.float16(0.004)).view(np.uint8)
            writer.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=kind)
            return
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN, scale=1.0)
    norm("output_norm.weight", HIDDEN)
    if arch == "phi3":  # long and short rotary factors, a dim's worth each
        for name in ("rope_factors_long", "rope_factors_short"):
            factors = rng.uniform(1.0, 4.0, HEAD_DIM * 3 // 8).astype(np.float32)
            writer.add_tensor(f"{name}.weight", factors)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        if arch == "phi3":
            matrix(f"blk.{i}.attn_qkv.weight", q + 2 * kv, HIDDEN, T.Q5_0)
            matrix(f"blk.{i}.ffn_up.weight", 2 * FFN, HIDDEN, T.Q4_K)
        else:
            matrix(f"blk.{i}.attn_q.weight", q, HIDDEN, T.Q5_0)
            matrix(f"blk.{i}.attn_k.weight", kv, HIDDEN, T.Q5_0)
            matrix(f"blk.{i}.attn_v.weight", kv, HIDDEN)
            matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN, T.Q4_K)
            matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN, T.Q4_K)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, q)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN, T.Q6_K)
        norm(f"blk.{i}.attn_norm.weight", HIDDEN)
        norm(f"blk.{i}.ffn_norm.weight", HIDDEN)
        if arch in ("qwen3", "gemma3"):
            norm(f"blk.{i}.attn_q_norm.weight", HEAD_DIM)
            norm(f"blk.{i}.attn_k_norm.weight", HEAD_DIM)
        if arch == "gemma3":
            norm(f"blk.{i}.post_attention_norm.weight", HIDDEN)
            norm(f"blk.{i}.post_ffw_norm.weight", HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def family_model(tmp_path, arch: str, seed: int = 0, **metadata):
    path = tmp_path / f"{arch}-{seed}.gguf"
    write_family(path, arch, seed, **metadata)
    model, _ = load_quantized(path)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    return {arch: family_model(folder, arch) for arch in FAMILIES}


def test_each_family_reads_its_own_metadata(models):
    gemma, phi, smol = models["gemma3"].config, models["phi3"].config, models["smollm3"].config
    assert gemma.layer_types == ["sliding_attention", "full_attention"] * 2
    assert gemma.sliding_window == WINDOW and gemma.query_pre_attn_scalar == HEAD_DIM
    assert smol.no_rope_layers == [1, 1, 1, 0]  # llama.cpp's rule: every 4th layer
    assert phi.partial_rotary_factor == 0.75 and phi.original_max_position_embeddings == 1024
    for arch, model in models.items():
        assert type(model).__name__ == "GgufForCausalLM"
        target = TorchTarget(model)
        assert target.row_invariant and target.decoder_pass.quantized_layers is not None, arch
    layers = TorchTarget(models["gemma3"]).decoder_pass.layers
    assert [(layer.window, layer.rope) for layer in layers] == [(WINDOW, 1), (0, 0)] * 2
    assert models["phi3"].model.rotary_emb.attention_scaling == pytest.approx(1.19)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("one_call", [True, False])
def test_every_row_of_a_pass_is_a_one_token_passs_row(models, arch, threads, one_call):
    """Passes of 1 to 17 rows after a prompt, each also run longer and cropped first (a
    rejected draft), equal one-token passes bit for bit: far past Gemma 3's window too."""
    torch.set_num_threads(threads)
    target = TorchTarget(models[arch], layers_in_one_call=one_call)
    rng = random.Random(threads)
    prompt = [rng.randrange(1, VOCAB) for _ in range(40)]
    tokens = [rng.randrange(1, VOCAB) for _ in range(40)]
    target.reset()
    target.forward(prompt)
    alone = torch.cat([target.forward([token]) for token in tokens])
    target.reset()
    target.forward(prompt)
    rows, fed = [], 0
    for size in [1, 2, 3, 5, 8, 17, 4]:
        start = target.cache_length
        target.forward([*tokens[fed : fed + size], *tokens[:3]])  # longer, then rejected
        target.crop(start)
        rows.append(target.forward(tokens[fed : fed + size]))
        fed += size
    assert torch.equal(torch.cat(rows), alone[:fed])


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_pass_longer_than_the_kernels_slice_gives_shorter_passes_rows(models, arch):
    """A 1,100-row pass (the C layers take 512 rows at a time: Gemma 3's two rotary tables and
    windows across slices) gives the rows of 300-row passes, bit for bit."""
    target = TorchTarget(models[arch])
    tokens = [(11 * i + 5) % VOCAB for i in range(1100)]
    whole = target.forward(tokens)
    target.reset()
    pieces = [target.forward(tokens[start : start + 300]) for start in range(0, 1100, 300)]
    assert torch.equal(torch.cat(pieces), whole)


@pytest.mark.parametrize("arch", FAMILIES)
def test_sequences_sharing_a_pass_get_their_own_rows(models, arch):
    prompts = [[1, 2, 3, 4, 5, 6] * 3, [9, 8, 7], [60, 61, 62, 63, 1, 2, 3, 4, 5, 6, 7] * 2]
    assert_sequences_get_their_own_rows(TorchTarget(models[arch]), prompts)


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_c_layers_the_python_layers_and_transformers_compute_one_model(models, arch):
    """Our C layers, our Python layers (exact, and with the fastest kernels: SDPA under masks
    made per window) and ``transformers``' own model for the family (the twin, over the same
    weights) agree up to rounding: the same model, not only an invariant one."""
    model = models[arch]
    tokens = [(7 * i + 3) % VOCAB for i in range(30)]  # past Gemma 3's window
    # float32 keys and values, as the fastest kernels and transformers keep them
    in_c = TorchTarget(model, kv_dtype="float32").forward(tokens)
    in_python = TorchTarget(model, layers_in_one_call=False, kv_dtype="float32").forward(tokens)
    scale = in_python.abs().max()
    assert torch.allclose(in_c, in_python, rtol=0, atol=1e-5 * scale)
    fastest = TorchTarget(model, row_invariant=False)  # masks by window, SDPA
    assert not fastest.row_invariant
    steps = torch.cat([fastest.forward(tokens[:20]), *(fastest.forward([t]) for t in tokens[20:])])
    assert torch.allclose(steps, in_python, rtol=0, atol=1e-4 * scale)
    twin = model.as_transformers()
    assert model.as_transformers() is twin
    with torch.inference_mode():
        theirs = twin(torch.tensor([tokens])).logits[0]
        generated = twin.generate(torch.tensor([tokens[:5]]), max_new_tokens=3, do_sample=False)
    assert torch.allclose(theirs, in_python, rtol=0, atol=1e-4 * scale), arch
    assert generated.shape == (1, 8)


def test_the_window_is_what_keeps_gemma_exact(models, tmp_path):
    """The harness has teeth for windows: the same file without its sliding window gives
    other logits once the sequence is longer than the window."""
    tokens = [(5 * i + 1) % VOCAB for i in range(3 * WINDOW)]
    windowed = TorchTarget(models["gemma3"]).forward(tokens)
    unwindowed = family_model(tmp_path, "gemma3", **{"attention.sliding_window": 0})
    assert unwindowed.config.layer_types == ["full_attention"] * LAYERS
    whole = TorchTarget(unwindowed).forward(tokens)
    assert torch.equal(windowed[:WINDOW], whole[:WINDOW])  # within the window: the same
    assert not torch.allclose(windowed[-1], whole[-1], atol=1e-3)


@pytest.mark.parametrize("arch", FAMILIES)
def test_drafting_and_batching_never_change_a_token(models, arch):
    lm = promptlookup.from_transformers(models[arch], TinyTokenizer(VOCAB), name=arch)
    rng = random.Random(1)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(8)] * 4, [3, 9, 4, 7, 12, 5] * 5]
    plain = [lm.generate(p, max_new_tokens=30, drafter="none").token_ids for p in prompts]
    drafted = 0
    for prompt, expected in zip(prompts, plain):
        for num_tokens in (1, 4, 9):
            result = lm.generate(
                prompt, max_new_tokens=30, speculation="fixed", num_tokens=num_tokens
            )
            assert result.token_ids == expected, num_tokens
            drafted += result.stats.accepted_tokens
        sampled = lm.generate(prompt, max_new_tokens=20, drafter="none", temperature=0.8, seed=3)
        again = lm.generate(prompt, max_new_tokens=20, num_tokens=6, temperature=0.8, seed=3)
        assert again.token_ids == sampled.token_ids
    assert drafted > 0
    batch = lm.generate_batch(prompts, max_new_tokens=30)
    assert [r.token_ids for r in batch] == plain


def test_metadata_we_do_not_reproduce_and_recurrent_files_are_named_errors(tmp_path):
    with pytest.raises(UnsupportedModelError, match="final_logit_softcapping"):
        family_model(tmp_path, "gemma3", **{"final_logit_softcapping": 30.0})
    with pytest.raises(UnsupportedModelError, match="RoPE scaling 'yarn'"):
        family_model(tmp_path, "qwen3", **{"rope.scaling.type": "yarn"})
    path = write_bare_gguf(tmp_path / "lfm2.gguf", "lfm2")
    with pytest.raises(RecurrentModelError, match="'lfm2' keeps recurrent state"):
        promptlookup.load_model(str(path))
    assert quantized_layers.kernel() is not None
