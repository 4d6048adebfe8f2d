"""Weight-first matrix products in verification passes: same products, chosen by measurement,
switched only inside our own passes; greedy output unchanged when every weight uses them."""

from __future__ import annotations

import pytest
import torch

from promptlookup.backends import linear
from promptlookup.backends.linear import LinearKernels, weight_first_linear
from promptlookup.backends.transformers_backend import TransformersTarget
from promptlookup.drafters import PromptLookupDrafter

from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import tiny_llama
from test_loop_greedy import hf_greedy, repeated_prompt, run


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 16), (1, 5, 16), (2, 4, 16)])
def test_weight_first_computes_the_linear_layer(shape, bias):
    module = torch.nn.Linear(16, 24, bias=bias)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    ours = weight_first_linear(module, x)
    assert ours.shape == (*shape[:-1], 24) and ours.is_contiguous()
    assert torch.allclose(ours, module(x), atol=1e-6, rtol=1e-5)


def _force(monkeypatch, weight_first: bool):
    monkeypatch.setattr(LinearKernels, "_weight_first_wins", lambda self, modules, rows: weight_first)


def test_one_token_passes_and_prompts_keep_transformers_kernels(monkeypatch):
    _force(monkeypatch, True)
    kernels = LinearKernels(tiny_llama(seed=2))
    assert kernels.weight_first_modules(1) == []  # plain steps: bit-identical to transformers
    assert kernels.weight_first_modules(linear.MAX_ROWS + 1) == []  # prompt chunks
    assert len(kernels.weight_first_modules(3)) == 2 * 7 + 1  # 7 per layer, plus the head


def test_switch_lasts_only_for_our_verification_pass(monkeypatch):
    _force(monkeypatch, True)
    model = tiny_llama(seed=2)
    calls = []
    real = linear.weight_first_linear
    monkeypatch.setattr(linear, "weight_first_linear",
                        lambda module, x: calls.append(x.shape[1]) or real(module, x))
    target = TransformersTarget(model)
    target.prefill([1, 2, 3, 4])  # a prompt: never switched
    target.forward([5])  # one token: never switched
    assert calls == []
    target.forward([6, 7, 8])
    assert calls == [3] * 15
    assert not any("forward" in vars(m) for m in model.modules())  # restored afterwards


def test_choice_is_measured_once_per_row_count(monkeypatch):
    timed = []
    monkeypatch.setattr(LinearKernels, "_weight_first_wins",
                        lambda self, modules, rows: timed.append(rows) or rows == 2)
    kernels = LinearKernels(tiny_llama(seed=2))
    groups = len(kernels.groups)
    assert len(kernels.weight_first_modules(2)) == 15 and kernels.weight_first_modules(4) == []
    kernels.weight_first_modules(2)
    assert timed == [2] * groups + [4] * groups


def test_measured_choice_runs_on_real_timings():
    kernels = LinearKernels(tiny_llama(seed=2))
    chosen = kernels.weight_first_modules(4)
    assert set(map(id, chosen)) <= {id(m) for ms in kernels.groups.values() for m in ms}
    assert 4 in kernels.choices


@pytest.mark.parametrize("seed", [3, 4, 6])
def test_greedy_output_unchanged_with_every_weight_first(monkeypatch, seed):
    _force(monkeypatch, True)
    model = tiny_llama(vocab_size=32, seed=seed)
    prompt = repeated_prompt(seed)
    tokens, stats = run(model, prompt, PromptLookupDrafter(num_tokens=6))
    assert tokens == hf_greedy(model, prompt, len(tokens))
    assert stats.accepted_tokens > 0 and stats.forward_passes < stats.new_tokens


def test_calibration_chooses_kernels_before_timing_passes(monkeypatch):
    from promptlookup.policy import QUICK_CALIBRATION_SIZES, CostModel

    target = TransformersTarget(tiny_llama(seed=2))
    target.prefill([1, 2, 3])
    timed_before_forward = []
    real_forward = target.forward
    monkeypatch.setattr(target, "forward", lambda ids: timed_before_forward.append(
        sorted(target.kernels.choices)) or real_forward(ids))
    CostModel().calibrate(target, probe_token=4, sizes=QUICK_CALIBRATION_SIZES, repeats=1)
    assert timed_before_forward[0] == [n for n in QUICK_CALIBRATION_SIZES if n >= 2]
    assert target.cache_length == 3


def test_choices_are_kept_in_a_file_and_reused(monkeypatch, tmp_path):
    path = tmp_path / "kernels.json"
    monkeypatch.setattr(LinearKernels, "_weight_first_wins",
                        lambda self, modules, rows: modules[0].out_features == 64)  # MLP up/gate
    first = LinearKernels(tiny_llama(seed=2))
    first.use_cache_file(path)
    assert len(first.weight_first_modules(3)) == 2 * 2  # gate and up projections, two layers

    def never(self, modules, rows):
        raise AssertionError("measured again")

    monkeypatch.setattr(LinearKernels, "_weight_first_wins", never)
    model = tiny_llama(seed=5)  # another model of the same shapes
    second = LinearKernels(model)
    second.use_cache_file(path)
    chosen = second.weight_first_modules(3)
    assert {id(m) for m in chosen} == {id(layer.mlp.gate_proj) for layer in model.model.layers} | {
        id(layer.mlp.up_proj) for layer in model.model.layers}


@pytest.mark.parametrize("content", ["{not json", '{"3": ["999x1-float32-nobias"]}', "[1, 2]"])
def test_an_unusable_choices_file_means_measuring_again(monkeypatch, tmp_path, content):
    path = tmp_path / "kernels.json"
    path.write_text(content)
    timed = []
    monkeypatch.setattr(LinearKernels, "_weight_first_wins",
                        lambda self, modules, rows: timed.append(rows) or False)
    kernels = LinearKernels(tiny_llama(seed=2))
    kernels.use_cache_file(path)
    assert kernels.weight_first_modules(3) == [] and timed
