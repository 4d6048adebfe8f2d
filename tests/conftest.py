"""Shared fixtures: tiny seeded float32 models built in-process, and the real default model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _cost_curves_in_a_temporary_folder(tmp_path_factory):
    """Measured cost curves go to a folder of this test session, not the user's cache (models
    saved under tmp paths would otherwise leave files there, and a test run measured on a busy
    machine would steer later real runs)."""
    from promptlookup import cache_files

    folder = tmp_path_factory.mktemp("costs")
    real = cache_files.cost_file_for
    cache_files.cost_file_for = lambda *args, **kwargs: folder / real(*args, **kwargs).name
    yield
    cache_files.cost_file_for = real


@pytest.fixture(autouse=True)
def _prefix_cache_folder_per_test(tmp_path, monkeypatch):
    """A server's default prefix cache folder (``--prefix-cache-dir auto``) is the test's own,
    not the user's cache: one test's blocks are never another's cached prompt."""
    from promptlookup import cache_files

    monkeypatch.setattr(cache_files, "prefix_cache_folder", lambda: tmp_path / "prefix-cache")


class TinyTokenizer:
    """A character-level tokenizer over a small vocabulary (ids 0..vocab-1), enough for the
    API's text handling: id 0 is EOS, id i >= 1 is chr(ord('a') + i - 1)."""

    eos_token_id = 0
    eos_token = "<eos>"
    pad_token_id = 0

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + (ord(c) - 97) % (self.vocab_size - 1) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i == 0 else chr(97 + i - 1) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return self(" ".join(m["content"] for m in messages))["input_ids"]


class AsciiTokenizer:
    """A character-level tokenizer over printable ASCII (id 0 is EOS, id i >= 1 is chr(31 + i),
    96 ids), enough for JSON and tool calls on a tiny model."""

    eos_token_id = 0
    eos_token = "<eos>"
    pad_token_id = 0
    vocab_size = 96

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) - 31 if 32 <= ord(c) < 127 else 1 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i == 0 else chr(31 + i) for i in ids)


def tiny_llama(vocab_size: int = 32, seed: int = 0, layers: int = 2, context: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=0,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    # Sharper logits make greedy continuations repetitive, so drafts get accepted.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_lm(tiny_model):
    import promptlookup

    return promptlookup.from_transformers(tiny_model, TinyTokenizer(32), name="tiny")


@pytest.fixture(scope="session")
def default_lm():
    """The real default model (SmolLM2-135M-Instruct, its GGUF's Q4_1/Q8_0 weights: dtype auto)."""
    import promptlookup
    from promptlookup.errors import ModelNotFoundError

    try:
        return promptlookup.load_model()
    except ModelNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data is absent ({SHARED_DATA}); real-data tests need it")
    return SHARED_DATA
