"""Loading packs a file's tensor chunk by chunk straight into its panels (no second copy of a
262,144-row embedding, its file pages dropped as it goes): every layout, header type and
loaded weight is bit for bit the tensor packed whole."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from test_quantized import random_tensor

from promptlookup.backends.gguf import blocks as gguf_blocks
from promptlookup.backends.gguf import quantized
from promptlookup.backends.gguf.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    QuantizedWeight,
)

pytestmark = pytest.mark.skipif(not quantized.available(), reason="no C compiler here")


def packed_whole(kind: str, raw: np.ndarray, k: int, half: bool | None = None) -> QuantizedWeight:
    """The reference: the whole tensor decoded and packed in one go."""
    return QuantizedWeight(gguf_blocks.decode(kind, raw, k), kind, half)


@pytest.mark.parametrize("kind", gguf_blocks.DECODED)
@pytest.mark.parametrize("rows", [16, 40, 100])
def test_chunks_pack_every_format_as_the_whole_tensor(kind, rows):
    raw = random_tensor(kind, rows, 256, seed=rows)
    chunked = QuantizedWeight.from_file(kind, raw, 256, chunk=32)
    whole = packed_whole(kind, raw, 256, half=kind in gguf_blocks.HALF_KINDS)
    assert (chunked.n, chunked.k, chunked.half) == (rows, 256, whole.half)
    assert torch.equal(chunked.panels, whole.panels)
    ids = torch.tensor([0, rows // 2, rows - 1])
    assert torch.equal(chunked.rows(ids), whole.rows(ids))


def test_a_scale_beyond_float16_in_a_late_chunk_gives_float32_headers_throughout():
    raw = random_tensor("Q5_0", 100, 256)
    raw[97, 0:2] = np.array([30000.0], dtype=np.float16).view(np.uint8)  # m = -16d overflows
    chunked = QuantizedWeight.from_file("Q5_0", raw, 256, chunk=32)
    whole = packed_whole("Q5_0", raw, 256)
    assert not chunked.half and not whole.half
    assert torch.equal(chunked.panels, whole.panels)


def test_each_packed_chunk_is_reported_and_chunks_keep_whole_panels():
    raw = random_tensor("Q4_K", 100, 256)
    done: list[int] = []
    QuantizedWeight.from_file("Q4_K", raw, 256, chunk=32, done=done.append)
    assert done == [32, 64, 96, 100]
    with pytest.raises(ValueError, match="split panels"):
        QuantizedWeight.from_file("Q4_K", raw, 256, chunk=24)


def test_a_loaded_file_holds_each_tensor_packed_whole(tmp_path, monkeypatch):
    """A tiny Llama GGUF (a tied Q8_0 embedding of 200 rows, Q4_K and Q6_K matrices) loaded in
    chunks of 16 rows, its file pages dropped chunk by chunk: every weight is the file's tensor
    packed whole (the query and key rows un-permuted as before)."""
    from promptlookup.backends.gguf.file import GgufFile
    from promptlookup.backends.gguf.loader import NAMES, _unpermute, load_quantized, module_path

    values = dict(vocab_size=200, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=True, rms_norm_eps=1e-5)  # fmt: skip
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (200, 256), "blk.{i}.attn_q": (256, 256), "blk.{i}.attn_k": (128, 256),
              "blk.{i}.attn_v": (128, 256), "blk.{i}.attn_output": (256, 256),
              "blk.{i}.ffn_gate": (256, 256), "blk.{i}.ffn_up": (256, 256),
              "blk.{i}.ffn_down": (256, 256)}  # fmt: skip
    for stem in NAMES:
        name = stem.format(i=0) + ".weight"
        if stem in shapes:
            kind = T.Q8_0 if stem == "token_embd" else T.Q6_K if "ffn" in stem else T.Q4_K
            raw = random_tensor(kind.name, shapes[stem][0], 256, seed=len(name))
            writer.add_tensor(name, raw, raw_dtype=kind)
        elif stem != "output":
            writer.add_tensor(name, rng.standard_normal(256).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **values}))
    monkeypatch.setattr(quantized, "CHUNK_ROWS", 16)
    model, _ = load_quantized(tmp_path / "tiny.gguf", tmp_path / "config.json")
    reader = GgufFile(tmp_path / "tiny.gguf")
    checked = 0
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in gguf_blocks.DECODED:
            continue
        where, _ = module_path(tensor.name)
        raw = np.asarray(tensor.data)
        heads = {"q_proj": 4, "k_proj": 2}.get(where.rpartition(".")[2])
        if heads:
            raw = raw[_unpermute(raw.shape[0], heads)]
        expected = packed_whole(tensor.tensor_type.name, raw, 256)
        module = model.get_submodule(where)
        assert isinstance(module, (QuantizedLinear, QuantizedEmbedding))
        assert torch.equal(module.quantized.panels, expected.panels), tensor.name
        checked += 1
    assert checked == 8
    assert model.lm_head.quantized is model.model.embed_tokens.quantized  # tied: one copy
