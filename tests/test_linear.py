"""Kernels for verification passes (weight-first, oneDNN-packed): same products, chosen by
measurement, switched only inside our own passes; greedy output unchanged whichever is used."""

from __future__ import annotations

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import tiny_llama
from test_loop_greedy import hf_greedy, repeated_prompt, run

from promptlookup.backends.gguf import linear
from promptlookup.backends.gguf.linear import (
    LinearKernels,
    packed_linear,
    packs,
    weight_first_linear,
)
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.backends.inexact.fastest import FastestKernels
from promptlookup.drafters import PromptLookupDrafter


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 16), (1, 5, 16), (2, 4, 16)])
def test_weight_first_computes_the_linear_layer(shape, bias):
    module = torch.nn.Linear(16, 24, bias=bias)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    ours = weight_first_linear(module, x)
    assert ours.shape == (*shape[:-1], 24) and ours.is_contiguous()
    assert torch.allclose(ours, module(x), atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_computes_the_linear_layer(dtype, bias):
    if not packs(dtype):
        pytest.skip(f"oneDNN does not reorder {dtype} weights on this CPU")
    module = torch.nn.Linear(16, 24, bias=bias).to(dtype)
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
    ours = packed_linear(module, x, packed)
    assert ours.shape == (1, 5, 24) and ours.dtype == dtype
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(ours.float(), module(x).float(), atol=tolerance, rtol=tolerance)


def _force(monkeypatch, kernel: str):
    monkeypatch.setattr(LinearKernels, "_fastest", lambda self, modules, rows: kernel)


def test_fastest_mode_keeps_nn_linear_for_float32_one_token_passes(monkeypatch):
    _force(monkeypatch, "weight_first")
    kernels = FastestKernels(tiny_llama(seed=2))
    assert kernels.choose(1) == {}  # float32 plain steps: bit-identical to transformers
    assert kernels.choose(0) == {}
    assert sum(len(kernels.groups[key]) for key in kernels.choose(3)) == 2 * 7 + 1  # + head


def test_prompt_chunks_use_the_choice_of_the_longest_timed_count(monkeypatch):
    timed = []
    monkeypatch.setattr(
        LinearKernels, "_fastest", lambda self, modules, rows: timed.append(rows) or "packed"
    )
    kernels = LinearKernels(tiny_llama(seed=2))
    longest = linear.TIMED_ROWS[-1]
    assert kernels.choose(longest + 1) == kernels.choose(2048) == kernels.choose(longest)
    assert set(timed) == {longest}


def test_row_counts_share_the_choice_of_the_next_timed_count(monkeypatch):
    timed = []
    monkeypatch.setattr(
        LinearKernels, "_fastest", lambda self, modules, rows: timed.append(rows) or "weight_first"
    )
    kernels = LinearKernels(tiny_llama(seed=2))
    groups = len(kernels.groups)
    for rows in (5, 6, 17, 24, 2):
        kernels.choose(rows)
    assert timed == [6] * groups + [24] * groups + [2] * groups


@pytest.mark.parametrize("kernel", ["weight_first", "packed"])
def test_switch_lasts_only_for_our_own_passes(monkeypatch, kernel):
    if kernel == "packed" and not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    _force(monkeypatch, kernel)
    model = tiny_llama(seed=2)
    calls = []
    for name in ("weight_first_linear", "packed_linear"):
        real = getattr(linear, name)
        monkeypatch.setattr(
            linear,
            name,
            lambda module, x, *args, real=real, name=name: (
                calls.append((name, x.shape[1])) or real(module, x, *args)
            ),
        )
    target = TorchTarget(model, row_invariant=False)
    target.forward([5])  # one float32 token: never switched
    assert calls == []
    target.forward([6, 7, 8])
    assert calls == [(f"{kernel}_linear", 3)] * 15
    target.extend([1, 2, 3, 4, 5])  # a prompt chunk: switched like a pass of its length
    assert calls[15:] == [(f"{kernel}_linear", 5)] * 14 + [(f"{kernel}_linear", 1)]  # head: last
    assert not any("forward" in vars(m) for m in model.modules())  # restored afterwards
    model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)
    assert len(calls) == 30  # transformers' own generate is untouched


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
def test_bfloat16_one_token_passes_may_switch(monkeypatch):
    _force(monkeypatch, "packed")
    kernels = LinearKernels(tiny_llama(seed=2).to(torch.bfloat16))
    assert sum(len(kernels.groups[key]) for key in kernels.choose(1)) == 15


def test_measured_choice_runs_on_real_timings():
    kernels = FastestKernels(tiny_llama(seed=2))
    assert set(kernels.choose(4).values()) <= {"weight_first", "packed"}
    assert 4 in kernels.choices
    packed_groups = {key for key, kernel in kernels.choose(4).items() if kernel == "packed"}
    # Reordered copies are kept only for the groups that use them.
    assert set(kernels.packed) == {id(m) for key in packed_groups for m in kernels.groups[key]}


@pytest.mark.parametrize("kernel", ["weight_first", "packed"])
@pytest.mark.parametrize("seed", [3, 4, 6])
def test_greedy_output_unchanged_whichever_kernel(monkeypatch, seed, kernel):
    if kernel == "packed" and not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    _force(monkeypatch, kernel)
    model = tiny_llama(vocab_size=32, seed=seed)
    prompt = repeated_prompt(seed)
    tokens, stats = run(model, prompt, PromptLookupDrafter(num_tokens=6))
    assert tokens == hf_greedy(model, prompt, len(tokens))
    assert stats.accepted_tokens > 0 and stats.forward_passes < stats.new_tokens


def test_calibration_chooses_kernels_before_timing_passes(monkeypatch):
    from promptlookup.calibration import time_passes
    from promptlookup.cost_store import QUICK_CALIBRATION_SIZES

    target = TorchTarget(tiny_llama(seed=2))
    target.extend([1, 2, 3])  # (chooses for 3 rows)
    timed_before_forward = []
    real_forward = target.forward
    monkeypatch.setattr(
        target,
        "forward",
        lambda ids: (
            timed_before_forward.append(sorted(target.kernels.choices)) or real_forward(ids)
        ),
    )
    time_passes(target, 4, QUICK_CALIBRATION_SIZES, repeats=1)
    longest = max(QUICK_CALIBRATION_SIZES)  # and every timed count below it
    assert timed_before_forward[0] == [rows for rows in linear.TIMED_ROWS if rows <= longest]
    assert target.cache_length == 3


def test_choices_are_kept_in_a_file_and_reused(monkeypatch, tmp_path):
    path = tmp_path / "kernels.json"
    monkeypatch.setattr(
        LinearKernels,
        "_fastest",
        lambda self, modules, rows: "weight_first" if modules[0].out_features == 64 else "linear",
    )  # MLP up/gate
    first = FastestKernels(tiny_llama(seed=2))
    first.use_cache_file(path)
    assert [len(first.groups[key]) for key in first.choose(3)] == [2 * 2]  # two layers

    def never(self, modules, rows):
        raise AssertionError("measured again")

    monkeypatch.setattr(LinearKernels, "_fastest", never)
    model = tiny_llama(seed=5)  # another model of the same shapes
    second = FastestKernels(model)
    second.use_cache_file(path)
    [(key, kernel)] = second.choose(3).items()
    assert kernel == "weight_first"
    assert {id(m) for m in second.groups[key]} == {
        id(getattr(layer.mlp, name))
        for layer in model.model.layers
        for name in ("gate_proj", "up_proj")
    }


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"3": {"999x1-float32-nobias": "packed"}}',
        '{"3": {"64x32-float32-nobias": "magic"}}',
        "[1, 2]",
    ],
)
def test_an_unusable_choices_file_means_measuring_again(monkeypatch, tmp_path, content):
    path = tmp_path / "kernels.json"
    path.write_text(content)
    timed = []
    monkeypatch.setattr(
        LinearKernels, "_fastest", lambda self, modules, rows: timed.append(rows) or "linear"
    )
    kernels = FastestKernels(tiny_llama(seed=2))
    kernels.use_cache_file(path)
    assert kernels.choose(3) == {} and timed


def test_the_loop_lets_the_target_set_up_each_pass_size_before_timing_it(monkeypatch):
    from promptlookup.loop import speculative_generate
    from promptlookup.policy import SpeculationPolicy

    target = TorchTarget(tiny_llama(seed=3))
    calls = []
    real_prepare, real_forward = target.prepare, target.forward
    monkeypatch.setattr(
        target, "prepare", lambda sizes: calls.append(("prepare", sizes)) or real_prepare(sizes)
    )
    monkeypatch.setattr(
        target, "forward", lambda ids: calls.append(("forward", len(ids))) or real_forward(ids)
    )
    prompt = repeated_prompt(3)
    list(
        speculative_generate(
            target,
            prompt,
            max_new_tokens=24,
            drafter=PromptLookupDrafter(),
            policy=SpeculationPolicy(exploration=2.0),
        )
    )
    calibration = max(
        i for i, call in enumerate(calls) if call[0] == "prepare" and len(call[1]) > 1
    )
    first_step = next(i for i, call in enumerate(calls) if i > calibration and call[0] == "prepare")
    steps = calls[first_step:]  # the calibration's own passes came before
    forwards = [i for i, call in enumerate(steps) if call[0] == "forward"]
    assert len(forwards) >= 2
    for i in forwards:
        assert steps[i - 1] == ("prepare", [steps[i][1]])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
def test_packed_copies_follow_changes_to_the_weights(monkeypatch):
    _force(monkeypatch, "packed")
    model = tiny_llama(seed=2)
    target = TorchTarget(model)
    target.extend([1, 2, 3])
    target.forward([4, 5])
    target.crop(3)
    with torch.no_grad():  # e.g. a merged adapter: the weights change in place
        model.lm_head.weight.mul_(-1.0)
    flipped = target.forward([4, 5])
    target.crop(3)
    monkeypatch.setattr(LinearKernels, "choose", lambda self, rows: {})  # nn.Linear throughout
    target.kernels.switches.clear()
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.allclose(flipped, target.forward([4, 5]), atol=1e-4, rtol=1e-4)


def test_kernel_timing_skips_the_warm_up_and_compares_within_rounds(monkeypatch):
    """``median_ratios``: first calls (reordering a weight) are not timed, and a slow spell
    that hits one round makes both sides of that round's ratio slow."""
    clock = [0.0]
    monkeypatch.setattr(linear.time, "perf_counter", lambda: clock[0])
    spell = {2: 3.0, 3: 3.0}  # rounds 2 and 3 (after the warm-up round 0) run 3x slower
    calls = {"linear": 0, "packed": 0}

    def kernel(name: str, seconds: float):
        def run():
            round_number = calls[name]
            calls[name] += 1
            first_call = 50.0 if name == "packed" and round_number == 0 else 0.0
            clock[0] += first_call + seconds * spell.get(round_number, 1.0)

        return run

    ratios = linear.median_ratios(
        {"linear": kernel("linear", 1.0), "packed": kernel("packed", 0.8)},
        baseline="linear",
        rounds=5,
    )
    assert calls == {"linear": 6, "packed": 6}
    assert ratios == {"linear": 1.0, "packed": pytest.approx(0.8)}


def test_row_invariant_mode_switches_every_product_one_row_included(monkeypatch):
    _force(monkeypatch, "packed")
    kernels = LinearKernels(tiny_llama(seed=2))
    for rows in (1, 3, 300):
        assert sum(len(kernels.groups[key]) for key in kernels.choose(rows)) == 2 * 7 + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_invariant_choices_compute_each_row_as_that_row_alone(dtype):
    """The kernels chosen by timing, whichever they are, give every row of a product exactly
    the product of that row on its own (which a one-token pass computes)."""
    model = tiny_llama(seed=2).to(dtype)
    kernels = LinearKernels(model)
    x = torch.randn(1, 40, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    for rows in (2, 5, 16, 40):
        with kernels.use(rows):
            together = model.model.layers[0].mlp.up_proj.forward(x[:, :rows])
        with kernels.use(1):
            alone = torch.cat(
                [model.model.layers[0].mlp.up_proj.forward(x[:, i : i + 1]) for i in range(rows)],
                dim=1,
            )
        assert torch.equal(together, alone)
    chosen = {kernel for rows in kernels.choices for kernel in kernels.choices[rows].values()}
    assert chosen <= {"packed", "linear", "weight_first", "rows"}


def test_a_reference_that_depends_on_the_row_count_falls_back_to_one_row_at_a_time(monkeypatch):
    kernels = LinearKernels(tiny_llama(seed=2))
    real = kernels._forward
    # A reference whose products of several rows round differently from one row's.
    monkeypatch.setattr(
        kernels,
        "_plain_forward",
        lambda kernel, module: (
            lambda x: real_plain(kernel, module)(x) + (x.numel() > 2 * x.shape[-1]) * 1e-3
        ),
    )
    real_plain = LinearKernels._plain_forward.__get__(kernels)
    assert set(kernels.choose(4).values()) == {"rows"}
    module = kernels.groups[next(iter(kernels.groups))][0]
    x = torch.randn(1, 4, module.in_features)
    rows = real("rows", module)(x)
    assert torch.equal(
        rows,
        torch.cat(
            [
                real("packed" if kernels.reference == "packed" else "linear", module)(
                    x[:, i : i + 1]
                )
                for i in range(4)
            ],
            dim=1,
        ),
    )
