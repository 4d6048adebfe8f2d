"""A GGUF's model in our own modules (backends/gguf/modules.py): the same bits as the
``transformers`` model over the same file, and none of ``transformers``' modelling code
imported to run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from promptlookup.backends.gguf import modules as gguf_modules
from promptlookup.backends.gguf.loader import NAMES, load_quantized
from promptlookup.backends.hf.target import TorchTarget

T = gguf.GGMLQuantizationType
VALUES = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=100000.0,
              tie_word_embeddings=True)  # fmt: skip


def write_tiny_gguf(folder, arch: str, seed: int = 0, freq_factors=None, stem: str = ""):
    """A random tiny model of ``arch`` (llama or qwen2: biases on the query, key and value
    projections) as a GGUF file, its metadata as the loader's cached config; the path.
    ``freq_factors``: a ``rope_freqs`` tensor, as llama.cpp writes Llama 3's scaled RoPE."""
    rng = np.random.default_rng(seed)
    path = folder / f"{stem or arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    if freq_factors is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(freq_factors, dtype=np.float32))
    hidden, inner, kv = VALUES["hidden_size"], VALUES["intermediate_size"], 2 * 16
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (inner, hidden),
              "ffn_up": (inner, hidden), "ffn_down": (hidden, inner)}  # fmt: skip
    writer.add_tensor(
        "token_embd.weight",
        gguf.quants.quantize(rng.normal(size=(64, hidden)).astype(np.float32), T.Q8_0),
        raw_dtype=T.Q8_0,
    )
    writer.add_tensor("output_norm.weight", rng.normal(1, 0.1, hidden).astype(np.float32))
    for i in range(VALUES["num_hidden_layers"]):
        for name, shape in shapes.items():
            weights = rng.normal(size=shape).astype(np.float32) * 0.2
            writer.add_tensor(
                f"blk.{i}.{name}.weight", gguf.quants.quantize(weights, T.Q4_1), raw_dtype=T.Q4_1
            )
            if arch == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(
                    f"blk.{i}.{name}.bias", rng.normal(size=shape[0]).astype(np.float32)
                )
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(
                f"blk.{i}.{name}.weight", rng.normal(1, 0.1, hidden).astype(np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (folder / f"{stem or arch}.json").write_text(json.dumps({"model_type": arch, **VALUES}))
    return path


def load_both(tmp_path, monkeypatch, arch: str):
    """The file loaded into our modules, and into ``transformers``' classes."""
    path = write_tiny_gguf(tmp_path, arch)
    ours, _ = load_quantized(path, tmp_path / f"{arch}.json")
    monkeypatch.setattr(gguf_modules, "takes", lambda model_type, values: False)
    theirs, _ = load_quantized(path, tmp_path / f"{arch}.json")
    return ours, theirs


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_our_modules_compute_the_transformers_models_bits(tmp_path, monkeypatch, arch):
    assert NAMES  # the loader's name table fills both module trees
    ours, theirs = load_both(tmp_path, monkeypatch, arch)
    assert type(ours).__name__ == "GgufForCausalLM"
    assert type(theirs).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    assert ours.config.max_position_embeddings == theirs.config.max_position_embeddings
    steps = [[3, 9, 27, 5, 60, 1, 7], [11], [12, 13, 14, 15], [2]]
    for one_call in (True, False):
        targets = [TorchTarget(m, layers_in_one_call=one_call) for m in (ours, theirs)]
        assert all(t.row_invariant for t in targets)
        for tokens in steps:
            logits = [t.forward(tokens) for t in targets]
            assert torch.equal(logits[0], logits[1])
    # Exactness off: our model still runs (written out; it has no forward of its own).
    fastest = TorchTarget(ours, row_invariant=False)
    assert fastest.forward([3, 9, 27]).shape == (3, 64) and fastest.forward([5]).shape == (1, 64)


@pytest.mark.parametrize("theta, head_dim", [(10000.0, 64), (100000.0, 64), (500000.0, 128)])
def test_the_rotary_embedding_is_llamas(theta, head_dim):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    values = {**VALUES, "hidden_size": 4 * head_dim, "head_dim": head_dim, "rope_theta": theta}
    ours = gguf_modules.GgufRotaryEmbedding(gguf_modules.gguf_config("llama", values))
    theirs = LlamaRotaryEmbedding(LlamaConfig(**values))
    hidden = torch.zeros(1, 1, 4 * head_dim)
    positions = torch.arange(0, 8192, 7)[None]
    for a, b in zip(ours(hidden, positions), theirs(hidden, positions)):
        assert torch.equal(a, b)


def test_as_transformers_shares_the_modules_and_generates(tmp_path):
    path = write_tiny_gguf(tmp_path, "llama")
    ours, _ = load_quantized(path, tmp_path / "llama.json")
    twin = ours.as_transformers()
    assert type(twin).__name__ == "LlamaForCausalLM" and ours.as_transformers() is twin
    assert twin.model.layers[1].mlp.down_proj is ours.model.layers[1].mlp.down_proj
    assert twin.model.norm.weight is ours.model.norm.weight
    assert twin not in list(ours.modules())  # not a submodule: no second state dict entry
    ids = torch.tensor([[3, 9, 27, 5, 60, 1]])
    # float32 keys and values, as transformers' own model keeps them
    own_pass = TorchTarget(ours, layers_in_one_call=False, kv_dtype="float32").forward(
        ids[0].tolist()
    )
    with torch.inference_mode():
        assert torch.allclose(twin(ids).logits[0], own_pass, atol=1e-4)
        assert twin.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 9)


def test_a_files_rope_freqs_divide_the_frequencies_as_llama3_scales_them(tmp_path, monkeypatch):
    """llama.cpp stores Llama 3's scaled RoPE as per-frequency factors (``rope_freqs``), which
    transformers' GGUF reader drops: our rotary embedding divides by them, giving Llama 3's
    frequencies; transformers' classes cannot take them (a named error: float32 then)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from promptlookup.errors import ModelLoadError, UnsupportedModelError

    scaled = LlamaConfig(**{**VALUES, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": VALUES["rope_theta"], "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }})  # fmt: skip
    llama3, _ = ROPE_INIT_FUNCTIONS["llama3"](scaled, None)
    plain = gguf_modules.GgufRotaryEmbedding(gguf_modules.gguf_config("llama", dict(VALUES)))
    factors = (plain.inv_freq / llama3).numpy()  # what llama.cpp's converter writes
    assert factors.min() == 1.0 and factors.max() > 7.9
    path = write_tiny_gguf(tmp_path, "llama", freq_factors=factors, stem="scaled")
    model, formats = load_quantized(path, tmp_path / "scaled.json")
    assert torch.allclose(model.model.rotary_emb.inv_freq, llama3, rtol=1e-6, atol=0)
    twin = model.as_transformers()  # its generate rotates by the file's frequencies too
    assert torch.equal(twin.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    unscaled, _ = load_quantized(write_tiny_gguf(tmp_path, "llama"), tmp_path / "llama.json")
    tokens = [3, 9, 27, 5, 60, 1, 7]
    assert not torch.equal(
        TorchTarget(model).forward(tokens), TorchTarget(unscaled).forward(tokens)
    )
    short = write_tiny_gguf(tmp_path, "llama", freq_factors=factors[:5], stem="short")
    with pytest.raises(ModelLoadError, match="5 factors for 8"):
        load_quantized(short, tmp_path / "short.json")
    monkeypatch.setattr(gguf_modules, "takes", lambda model_type, values: False)
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        load_quantized(path, tmp_path / "scaled.json")


def test_a_file_our_modules_do_not_reproduce_keeps_transformers_classes():
    assert gguf_modules.takes("llama", dict(VALUES))
    assert gguf_modules.takes("qwen2", {**VALUES, "use_sliding_window": False})
    assert not gguf_modules.takes("qwen2", {**VALUES, "use_sliding_window": True})
    assert not gguf_modules.takes("llama", {**VALUES, "rope_scaling": {"rope_type": "llama3"}})
    assert not gguf_modules.takes("mistral", dict(VALUES))


def test_serving_a_gguf_imports_no_modelling_code(default_lm, tmp_path):
    """The default model loaded with an empty cache (its tokenizer and metadata read by a child
    process) and answering, in a fresh process: transformers' modelling code, about 130 MiB
    of memory, is never imported there."""
    script = (
        "import sys, promptlookup\n"
        "lm = promptlookup.load_model()\n"
        "lm.generate('Say hi.', chat=True, max_new_tokens=3, drafter='none')\n"
        "heavy = [m for m in ('transformers.modeling_utils', 'torch._dynamo', 'sympy', 'scipy')"
        " if m in sys.modules]\n"
        "print(type(lm.model).__name__, heavy)\n"
    )
    env = {**os.environ, "PROMPTLOOKUP_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "GgufForCausalLM []"
    assert any((tmp_path / "cache" / "tokenizers-v3").iterdir())  # the child's reading, kept
