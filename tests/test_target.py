"""The torch target's prompt: its last chunk waits for the first forward pass, so a
request's prefill and first step are one pass (as ``model.generate``'s prefill also gives the
first token), with the logits of a prompt fed up front."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from promptlookup.backends.hf import target as hf_target
from promptlookup.backends.hf.target import TorchTarget


def _spied(target: TorchTarget) -> list[tuple[int, int]]:
    """(tokens, logits kept) of each pass ``target`` runs from now on."""
    runs = []
    run = target._run
    target._run = lambda ids, logits_to_keep: (
        runs.append((len(ids), logits_to_keep)) or run(ids, logits_to_keep)
    )
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_and_the_first_step_are_one_pass(dtype):
    model = tiny_llama(vocab_size=40, seed=21).to(dtype)
    waiting, eager = TorchTarget(model), TorchTarget(model)
    prompt = [(3 * i) % 39 + 1 for i in range(30)]
    runs = _spied(waiting)
    waiting.prefill(prompt)
    assert runs == [] and waiting.cache_length == 30
    logits = waiting.forward([7, 8, 9])
    assert runs == [(33, 3)] and waiting.cache_length == 33
    eager.extend(prompt)
    expected = eager.forward([7, 8, 9])
    assert logits.shape == expected.shape == (3, 40)
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    assert torch.allclose(logits, expected, atol=tolerance, rtol=0)
    # Later steps are passes over their own tokens only.
    waiting.crop(31)
    waiting.forward([8])
    assert runs[1:] == [(1, 1)]


def test_a_prompt_longer_than_a_chunk_runs_its_whole_chunks_at_once(monkeypatch):
    monkeypatch.setattr(hf_target, "PREFILL_CHUNK", 8)
    target = TorchTarget(tiny_llama(seed=22))
    runs = _spied(target)
    target.prefill(list(range(1, 21)))  # 20 tokens: two chunks now, four wait
    assert runs == [(8, 1), (8, 1)] and target.cache_length == 20
    target.forward([5])
    assert runs[2:] == [(5, 1)]
    target.reset()
    target.prefill(list(range(1, 17)))  # 16 tokens: one chunk now, a whole one waits
    assert runs[3:] == [(8, 1)]
    target.prefill([3])  # more of the prompt: never more than a chunk waits
    assert runs[3:] == [(8, 1), (8, 1)] and target.cache_length == 17
    target.extend([4])  # feeding on with logits runs what waits first
    assert runs[5:] == [(2, 1)] and target.cache_length == 18


def test_crop_may_drop_waiting_prompt_tokens():
    model = tiny_llama(vocab_size=40, seed=23)
    target, eager = TorchTarget(model), TorchTarget(model)
    prompt = list(range(1, 13))
    target.prefill(prompt)
    target.crop(9)
    assert target.cache_length == 9
    eager.extend(prompt[:9])
    assert torch.allclose(target.forward([5, 6]), eager.forward([5, 6]), atol=1e-5, rtol=0)
    target.reset()
    target.prefill(prompt)
    target.crop(12)  # nothing to drop
    assert target.cache_length == 12
