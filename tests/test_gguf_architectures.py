"""A tiny random-weight Gemma 3 GGUF (sliding-window layers, no chat template) as a user loads
it: quantized in our engine by default, the same model as ``transformers``' float32 reading of
the file, and in float32 (``dtype="float32"``) through ``transformers``, whose window layers our
cache keeps croppable; an architecture nobody reads is one named error."""

from __future__ import annotations

import string
import warnings

import gguf
import numpy as np
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from click.testing import CliRunner
from gguf import GGMLQuantizationType
from test_cli import assert_one_line_error

import promptlookup
from promptlookup.backends.hf.cache import GrowingLayer
from promptlookup.backends.hf.target import WindowLayer
from promptlookup.cli import main
from promptlookup.errors import UnsupportedModelError

WINDOW = 8  #: the tiny model's sliding window, far shorter than the prompts
PROMPT = "the cat sat on the mat. the cat sat on the mat. the dog sat on the"


def write_tiny_gemma3(path, layers: int = 6, hidden: int = 64, head_dim: int = 256, ffn: int = 128):
    """A Gemma 3 GGUF as llama.cpp's converter lays one out (Q8_0 matrices, norms stored as
    ``1 + weight``, a SentencePiece vocabulary of letters), with random weights and no chat
    template. Six layers: the first five are sliding-window ones. Heads of 256, as Gemma 3's
    own: the query scale that ``transformers`` assumes for a GGUF (1/16) is then llama.cpp's."""
    rng = np.random.default_rng(0)
    letters = list(string.ascii_lowercase)
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581"] + [f"\u2581{c}" for c in letters]
    tokens += [*letters, ".", ","]
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([3, 3, 3, 2] + [1] * (len(tokens) - 4))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def matrix(name: str, rows: int, cols: int, scale: float = 0.3) -> None:
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        kind = GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden, scale=1.0)
    norm("output_norm.weight", hidden)
    for i in range(layers):
        for name, rows, cols in (
            ("attn_q", 2 * head_dim, hidden),
            ("attn_k", head_dim, hidden),
            ("attn_v", head_dim, hidden),
            ("attn_output", hidden, 2 * head_dim),
            ("ffn_gate", ffn, hidden),
            ("ffn_up", ffn, hidden),
            ("ffn_down", hidden, ffn),
        ):
            matrix(f"blk.{i}.{name}.weight", rows, cols)
        for name, size in (
            ("attn_norm", hidden),
            ("attn_q_norm", head_dim),
            ("attn_k_norm", head_dim),
            ("post_attention_norm", hidden),
            ("ffn_norm", hidden),
            ("post_ffw_norm", hidden),
        ):
            norm(f"blk.{i}.{name}.weight", size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3")
    write_tiny_gemma3(folder / "tiny-gemma3.gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROMPTLOOKUP_CACHE", str(folder / "cache"))
        lm = promptlookup.load_model(str(folder / "tiny-gemma3.gguf"), dtype="float32")
    return lm


def test_gemma3_loads_quantized_as_the_same_model(gemma, tmp_path, monkeypatch):
    """By default the file runs in our engine (no warning), row-invariant, and computes the
    model ``transformers`` reads from it (norms stored as ``1 + w``, embeddings scaled)."""
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    write_tiny_gemma3(tmp_path / "tiny-gemma3.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        lm = promptlookup.load_model(str(tmp_path / "tiny-gemma3.gguf"))
    assert type(lm.model).__name__ == "GgufForCausalLM" and lm.target.row_invariant
    assert lm.target.weights_format == "Q8_0 GGUF, float32 activations"
    ids = gemma.encode(PROMPT)
    assert lm.encode(PROMPT) == ids and len(ids) > 3 * WINDOW
    with torch.inference_mode():
        theirs = gemma.model(torch.tensor([ids])).logits[0]
    ours = lm.target.forward(ids)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-4 * theirs.abs().max())
    plain = lm.generate(PROMPT, max_new_tokens=30, drafter="none")
    drafted = lm.generate(PROMPT, max_new_tokens=30, speculation="fixed", num_tokens=6)
    assert drafted.token_ids == plain.token_ids and drafted.stats.accepted_tokens > 0


def test_gemma3_in_float32_keeps_croppable_window_layers(gemma):
    assert type(gemma.model).__name__ == "Gemma3ForCausalLM"
    assert gemma.model.config.sliding_window == WINDOW
    assert gemma.target.weights_format == "float32 weights and activations"
    assert not gemma.target.row_invariant  # the model's own forward: no written-out pass
    layers = [type(layer) for layer in gemma.target.new_sequence().layers]
    assert layers == [WindowLayer] * 5 + [GrowingLayer]
    assert gemma.target.can_crop


def test_window_layers_attend_as_the_whole_sequence_does(gemma):
    """Passes of several tokens, with crops of rejected ones, far past the window: each
    token's logits are those of one forward pass over the whole sequence (the mask keeps
    the sliding layers' queries in their window)."""
    ids = gemma.encode(PROMPT)
    assert len(ids) > 3 * WINDOW
    with torch.inference_mode():
        whole = gemma.model(torch.tensor([ids])).logits[0].float()
    target = gemma.target
    target.reset()
    target.prefill(ids[:5])
    logits, position = [], 5
    for size, rejected in ((3, 0), (6, 4), (5, 1), (9, 3), (7, 0), (8, 5)):
        rows = target.forward(ids[position : position + size])
        kept = size - rejected
        target.crop(position + kept)
        logits.append(rows[:kept])
        position += kept
    logits = torch.cat(logits)
    assert position > 3 * WINDOW and target.cache_length == position
    assert torch.allclose(logits, whole[5:position], atol=1e-4)


def test_gemma3_drafting_never_changes_the_greedy_tokens(gemma):
    prompts = [PROMPT, "a b c d e f g h i j k l m n o p a b c d e f g h i j k l m n o p a b c"]
    plain = [gemma.generate(p, max_new_tokens=40, drafter="none") for p in prompts]

    def half_right(tokens, max_tokens):  # the last token again, then a wrong one: rollbacks
        wrong = tokens[0] if tokens[0] != tokens[-1] else tokens[1]
        return [tokens[-1]] * (max_tokens // 2) + [wrong] * (max_tokens - max_tokens // 2)

    for prompt, expected in zip(prompts, plain):
        for drafter in ("prompt-lookup", half_right):
            drafted = gemma.generate(
                prompt, max_new_tokens=40, speculation="fixed", num_tokens=6, drafter=drafter
            )
            assert drafted.token_ids == expected.token_ids
            assert drafted.stats.accepted_tokens > 0
        assert drafted.stats.drafted_tokens > drafted.stats.accepted_tokens  # some rejected
    batch = gemma.generate_batch(prompts, max_new_tokens=40)
    assert [r.token_ids for r in batch] == [r.token_ids for r in plain]


def test_messages_without_a_chat_template_are_their_text(gemma):
    assert not gemma.tokenizer.chat_template
    messages = [
        {"role": "system", "content": "the cat"},
        {"role": "user", "content": [{"type": "text", "text": "sat"}]},
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = gemma.encode(messages)
        assert gemma.encode("the cat", chat=True) == gemma.encode("the cat")
    assert ids == gemma.encode("the cat\n\nsat")
    told = [w for w in caught if "no chat template" in str(w.message)]
    assert len(told) == 1  # once per model


def write_bare_gguf(path, arch: str):
    """A GGUF of ``arch`` with one block and an all-zero embedding, nothing else; the path."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_architecture_nothing_reads_is_one_named_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    path = write_bare_gguf(tmp_path / "odd.gguf", "no-such-arch")
    for dtype in ("auto", "float32"):
        with pytest.raises(UnsupportedModelError, match="architecture 'no-such-arch'") as caught:
            promptlookup.load_model(str(path), dtype=dtype)
        assert "\n" not in str(caught.value) and "odd.gguf" in str(caught.value)
    result = CliRunner().invoke(main, ["generate", "--model", str(path), "hi"])
    assert result.exit_code == 1
    assert_one_line_error(result, "odd.gguf", "architecture 'no-such-arch' is not supported")
