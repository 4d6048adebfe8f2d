"""Quantized weights: every GGUF format decodes to the file's own values, every row of a
quantized product is computed bit for bit as that row alone (any row count, any thread count,
fused or not), and a quantized model's outputs do not depend on drafting or batching."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from conftest import TinyTokenizer
from gguf import GGMLQuantizationType as T

import promptlookup
from promptlookup.backends.gguf import blocks as gguf_blocks
from promptlookup.backends.gguf import quantized
from promptlookup.backends.gguf.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    QuantizedWeight,
)

pytestmark = pytest.mark.skipif(not quantized.available(), reason="no C compiler here")
#: The integer offsets of each format's float16 fields within a block.
HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0]}
HALVES |= {"Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_tensor(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes (n, row bytes) of random blocks of ``kind``, scales kept finite."""
    rng = np.random.default_rng(seed)
    size, nbytes = gguf.GGML_QUANT_SIZES[T[kind]]
    raw = rng.integers(0, 256, (n, k // size, nbytes), dtype=np.uint8)
    for offset in HALVES[kind]:
        scale = rng.standard_normal((n, k // size, 1)).astype(np.float16) * np.float16(0.05)
        raw[..., offset : offset + 2] = scale.view(np.uint8)
    return raw.reshape(n, -1)


def weight(kind: str, n: int, k: int, seed: int = 0) -> QuantizedWeight:
    return QuantizedWeight(gguf_blocks.decode(kind, random_tensor(kind, n, k, seed), k), kind)


@pytest.mark.parametrize("kind", gguf_blocks.DECODED)
def test_every_format_decodes_to_the_files_own_weights(kind):
    raw = random_tensor(kind, 40, 512)
    expected = gguf.quants.dequantize(raw, T[kind])
    assert np.array_equal(gguf_blocks.dequantize(gguf_blocks.decode(kind, raw, 512)), expected)


@pytest.mark.parametrize("kind", ["Q4_1", "Q6_K", "Q8_0", "Q5_0"])
def test_products_are_the_dequantized_weights_products(kind):
    w = weight(kind, 70, 256)
    x = torch.randn(5, 256)
    dense = torch.from_numpy(
        gguf_blocks.dequantize(gguf_blocks.decode(kind, random_tensor(kind, 70, 256), 256))
    )
    expected = x.double() @ dense.double().T
    scale = expected.abs().max()  # float32 sums of K products: within K ulps of the largest
    assert (w.matmul(x).double() - expected).abs().max() <= 1e-5 * scale
    bias = torch.randn(70)
    assert (w.matmul(x, bias).double() - expected - bias.double()).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K", "Q6_K", "Q8_0", "Q5_1"])
def test_every_row_is_computed_as_that_row_alone(kind, threads):
    """At every row count up to three whole tiles and more (and a prompt-sized one), with and
    without a bias, each row's bits are those of the one-row product."""
    torch.set_num_threads(threads)
    w = weight(kind, 200, 512, seed=3)  # 13 panels, the last one partial
    x = torch.randn(40, 512)
    bias = torch.randn(200)
    alone = torch.cat([w.matmul(x[i : i + 1], bias) for i in range(40)])
    for rows in range(2, 41):
        assert torch.equal(w.matmul(x[:rows], bias), alone[:rows]), rows
    prompt = torch.randn(300, 512)
    assert torch.equal(w.matmul(prompt)[137], w.matmul(prompt[137:138])[0])


def test_fused_outputs_are_each_weights_outputs():
    parts = [weight("Q4_1", n, 256, seed=n) for n in (64, 32, 32)]
    x = torch.randn(6, 256)
    separate = torch.cat([w.matmul(x) for w in parts], dim=-1)
    joined = quantized.fused(parts)
    assert torch.equal(joined.matmul(x), separate)
    assert torch.equal(torch.cat([w.matmul(x) for w in parts], dim=-1), separate)  # views now
    assert quantized.fused([weight("Q4_1", 64, 256), weight("Q8_0", 64, 256)]) is None


def test_embedding_rows_are_the_weights_rows():
    raw = random_tensor("Q8_0", 50, 64)
    w = QuantizedWeight(gguf_blocks.decode("Q8_0", raw, 64), "Q8_0")
    ids = torch.tensor([[0, 49, 7]])
    rows = QuantizedEmbedding(w)(ids)
    expected = gguf.quants.dequantize(raw, T.Q8_0)[[0, 49, 7]]
    assert rows.shape == (1, 3, 64) and np.array_equal(rows[0].numpy(), expected)


def quantized_tiny(seed: int = 0):
    """A tiny random Llama whose linear layers and embedding are Q4_0 / Q8_0 / Q4_1 quantized
    (as loading a GGUF makes them), the head tied to the embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    kinds = iter(["Q4_0", "Q8_0", "Q4_1"] * 10)
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                kind = next(kinds)
                raw = gguf.quants.quantize(module.weight.numpy() * 4, T[kind])
                q = QuantizedWeight(gguf_blocks.decode(kind, raw, module.in_features), kind)
                parent, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, QuantizedLinear(q))
        table = model.model.embed_tokens.weight.numpy()
        embedding = QuantizedWeight(
            gguf_blocks.decode("Q8_0", gguf.quants.quantize(table, T.Q8_0), 64), "Q8_0"
        )
        model.model.embed_tokens = QuantizedEmbedding(embedding)
        model.lm_head = QuantizedLinear(embedding)
    model.config.gguf_formats = {"Q4_0": 1, "Q8_0": 1, "Q4_1": 1}
    return model


def test_a_quantized_model_runs_row_invariant_passes():
    lm = promptlookup.from_transformers(quantized_tiny(), TinyTokenizer(64))
    assert lm.target.row_invariant and lm.target.decoder_pass is not None
    assert lm.target.weights_format == "Q4_0+Q8_0+Q4_1 GGUF, float32 activations"


@pytest.mark.parametrize("seed", [0, 1])
def test_drafting_and_batching_never_change_a_quantized_models_tokens(seed):
    lm = promptlookup.from_transformers(quantized_tiny(seed), TinyTokenizer(64))
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3] * 3, [7, 8, 9, 7, 8, 9, 7, 8]]
    plain = [lm.generate(p, max_new_tokens=40, drafter="none").token_ids for p in prompts]
    for p, expected in zip(prompts, plain):
        drafted = lm.generate(p, max_new_tokens=40, speculation="fixed", num_tokens=8)
        assert drafted.token_ids == expected
        assert drafted.stats.drafted_tokens > 0
    assert [r.token_ids for r in lm.generate_batch(prompts, max_new_tokens=40)] == plain


def test_a_gguf_file_loads_quantized_with_llamas_rotary_rows_restored(tmp_path):
    """A tiny Llama GGUF written with the gguf package: the loaded model's logits are those of
    the same model with the dequantized weights, query and key rows un-permuted as
    transformers' GGUF loader does it."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from promptlookup.backends.gguf.loader import NAMES, load_quantized

    values = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=True, rms_norm_eps=1e-5)  # fmt: skip
    reference = LlamaForCausalLM(LlamaConfig(**values)).eval()
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    processor = LlamaTensorProcessor(config=values)
    names = {module: tensor for tensor, module in NAMES.items()}  # module path -> GGUF name
    state = {}
    for name, tensor in reference.state_dict().items():
        if name == "lm_head.weight":
            continue
        stem, _, leaf = name.rpartition(".")
        parts = stem.split(".")
        key = ".".join(p if not p.isdigit() else "{i}" for p in parts)
        gguf_name = names[key].format(i=next((p for p in parts if p.isdigit()), "")) + "." + leaf
        array = tensor.numpy()
        if array.ndim == 2:
            kind = T.Q8_0 if "embed" in name else T.Q4_1
            quant = gguf.quants.quantize(array * 8, kind)
            writer.add_tensor(gguf_name, quant, raw_dtype=kind)
            # The file's rows are read as llama.cpp's converter wrote them (query and key rows
            # permuted): the reference holds what transformers' loader makes of them.
            dense = gguf.quants.dequantize(quant, kind)
            state[name] = torch.from_numpy(processor.process(dense, gguf_name).weights.copy())
        else:
            writer.add_tensor(gguf_name, array)
            state[name] = tensor
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **values}))
    model, formats = load_quantized(tmp_path / "tiny.gguf", tmp_path / "config.json")
    assert formats == {"Q8_0": 1, "Q4_1": 14, "F32": 5}
    reference.load_state_dict(state, strict=False)
    reference.tie_weights()
    ids = torch.tensor([[3, 9, 27, 5, 60, 1]])
    with torch.inference_mode():
        assert torch.allclose(model.as_transformers()(ids).logits, reference(ids).logits, atol=1e-4)


def test_a_file_tensor_packed_in_chunks_is_packed_whole():
    raw = random_tensor("Q4_K", 100, 256)
    whole = QuantizedWeight(gguf_blocks.decode("Q4_K", raw, 256), "Q4_K")
    chunked = QuantizedWeight.from_file("Q4_K", raw, 256, chunk=32)
    assert chunked.n == 100 and torch.equal(chunked.panels, whole.panels)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q5_1"])
def test_float16_headers_hold_the_same_weights(kind):
    """Formats with float16 scales pack them in 2 bytes: the products, the embedding rows and
    every bit are those of the float32 headers."""
    blocks = gguf_blocks.decode(kind, random_tensor(kind, 70, 256), 256)
    half, full = QuantizedWeight(blocks, kind), QuantizedWeight(blocks, kind, half=False)
    assert half.half and not full.half and half.nbytes < full.nbytes
    x = torch.randn(20, 256)
    assert torch.equal(half.matmul(x), full.matmul(x))
    ids = torch.tensor([0, 17, 69])
    assert torch.equal(half.rows(ids), full.rows(ids))


def test_a_scale_beyond_float16_keeps_float32_headers():
    raw = random_tensor("Q5_0", 40, 256)
    raw[3, 0:2] = np.array([30000.0], dtype=np.float16).view(np.uint8)  # d; m = -16d overflows
    assert not QuantizedWeight.from_file("Q5_0", raw, 256, chunk=16).half
    assert QuantizedWeight.from_file("Q5_0", random_tensor("Q5_0", 40, 256), 256).half
