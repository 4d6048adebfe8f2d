"""Continuous batching: many sequences in one forward pass never change a token. Each
sequence's logits, greedy and seeded-sampling outputs equal what it gets alone, with ragged
acceptance, EOS inside a batch, sequences joining and leaving mid-run and one cancelled."""

from __future__ import annotations

import random

import pytest
import torch
from _fixtures import attention_path, one_thread  # noqa: F401 (fixtures)
from conftest import TinyTokenizer, tiny_llama
from test_decoder_pass import _tiny

import promptlookup
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.batching import BatchDecoder, BatchSequence, default_max_batch
from promptlookup.drafters import make_drafter
from promptlookup.errors import InvalidParameterError, UnsupportedModelError
from promptlookup.loop import speculative_generate
from promptlookup.policy import AcceptanceModel, SequenceDraft, SpeculationPolicy
from promptlookup.sampling import SamplingParams, TokenChooser


def repetitive_prompts(seed: int, count: int, vocab: int = 32) -> list[list[int]]:
    """Prompts of 3-200 tokens that repeat spans of themselves (so drafts are found, and
    accepted to different lengths: ragged acceptance)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        motif = [rng.randrange(1, vocab) for _ in range(rng.randint(2, 12))]
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(1, 8))]
        while len(prompt) < rng.randint(3, 200):
            prompt += motif[: rng.randint(1, len(motif))] + [rng.randrange(1, vocab)]
        prompts.append(prompt)
    return prompts


def alone(target, prompt, max_new_tokens=32, drafter="none", params=SamplingParams(), eos=()):
    return list(
        speculative_generate(
            target,
            prompt,
            max_new_tokens=max_new_tokens,
            drafter=make_drafter(drafter),
            chooser=TokenChooser.from_params(params),
            eos_token_ids=eos,
        )
    )


def batched(
    target,
    prompts,
    max_new_tokens=32,
    drafter="prompt-lookup",
    params=SamplingParams(),
    eos=(),
    max_batch=3,
    prefill_tokens=48,
    policy=None,
):
    decoder = BatchDecoder(
        target, policy or SpeculationPolicy(), max_batch=max_batch, prefill_tokens=prefill_tokens
    )
    sequences = [
        decoder.add(
            BatchSequence(
                prompt, max_new_tokens, make_drafter(drafter), TokenChooser.from_params(params), eos
            )
        )
        for prompt in prompts
    ]
    for _ in decoder.run():
        pass
    return [sequence.tokens[len(sequence.prompt_ids) :] for sequence in sequences], sequences


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
def test_each_sequence_of_a_batched_pass_gets_the_logits_it_gets_alone(
    architecture, dtype, attention_path
):
    model = _tiny(architecture, vocab_size=32, seed=1, layers=2).to(dtype)
    target = TorchTarget(model)
    rng = random.Random(2)
    prompts = [[rng.randrange(1, 32) for _ in range(n)] for n in (1, 5, 63, 64, 130)]
    news = [[rng.randrange(1, 32) for _ in range(n)] for n in (1, 7, 2, 16, 3)]
    expected = []
    for prompt, new in zip(prompts, news):
        target.reset()
        target.prefill(prompt)
        expected.append(target.forward(new))
    caches = [target.new_sequence() for _ in prompts]
    target.forward_batch(caches, [p[:-1] for p in prompts], [0] * len(prompts))  # prompts
    # Each prompt's last token and the new tokens; logits of the new tokens only.
    together = target.forward_batch(
        caches, [[p[-1], *n] for p, n in zip(prompts, news)], [len(new) for new in news]
    )
    for want, got in zip(expected, together):
        assert torch.equal(want, got)
    assert [cache.get_seq_length() for cache in caches] == [
        len(p) + len(n) for p, n in zip(prompts, news)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_greedy_equals_single_stream_with_ragged_acceptance(seed, attention_path):
    target = TorchTarget(tiny_llama(seed=seed))
    prompts = repetitive_prompts(seed, 7)
    want = [alone(target, prompt) for prompt in prompts]
    got, sequences = batched(target, prompts)  # 7 sequences through 3 slots: join and leave
    assert got == want
    accepted = [sequence.stats.accepted_tokens for sequence in sequences]
    assert len(set(accepted)) > 1 and max(accepted) > 0  # drafts accepted, unevenly


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_seeded_sampling_equals_single_stream(seed):
    target = TorchTarget(tiny_llama(seed=seed))
    prompts = repetitive_prompts(10 + seed, 5)
    params = SamplingParams(temperature=0.9, top_k=8, repetition_penalty=1.1, seed=seed)
    want = [alone(target, prompt, params=params) for prompt in prompts]
    got, _ = batched(target, prompts, params=params, max_batch=5)
    assert got == want


def test_a_sequence_that_meets_eos_leaves_and_the_others_go_on():
    target = TorchTarget(tiny_llama(seed=3))
    prompts = repetitive_prompts(3, 4)
    free = [alone(target, prompt, max_new_tokens=24) for prompt in prompts]
    eos = (free[0][5],)  # the first sequence's sixth token ends it
    want = [alone(target, prompt, max_new_tokens=24, eos=eos) for prompt in prompts]
    got, sequences = batched(target, prompts, max_new_tokens=24, eos=eos, max_batch=4)
    assert got == want
    assert sequences[0].finish_reason == "stop" and len(got[0]) <= 6
    assert {s.finish_reason for s in sequences} <= {"stop", "length"}


def four_sequences():
    """Four prompts, their tokens alone, and a decoder with the four queued (32 tokens each)."""
    target = TorchTarget(tiny_llama(seed=4))
    prompts = repetitive_prompts(4, 4)
    want = [alone(target, prompt) for prompt in prompts]
    decoder = BatchDecoder(target, SpeculationPolicy(), max_batch=4)
    sequences = [
        decoder.add(BatchSequence(prompt, 32, make_drafter("prompt-lookup"))) for prompt in prompts
    ]
    return prompts, want, decoder, sequences


def test_a_cancelled_sequence_changes_no_other():
    prompts, want, decoder, sequences = four_sequences()
    steps = 0
    for sequence, _ in decoder.run():
        steps += sequence is sequences[0]
        if steps == 2:
            sequences[1].cancel()
    assert (
        sequences[1].finish_reason == "cancelled"
        and len(sequences[1].tokens) < len(prompts[1]) + 32
    )
    for index in (0, 2, 3):
        assert sequences[index].tokens[len(prompts[index]) :] == want[index]


class FailingProcessor:
    """A logits processor that raises at its ``at``-th call (a sequence's own failure)."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("the processor's internal state")
        return scores


@pytest.mark.parametrize("fails_in", ["propose", "accept"])
def test_a_sequence_whose_own_step_raises_ends_alone_and_the_others_go_on(fails_in):
    prompts, want, decoder, sequences = four_sequences()
    bad = sequences[1]
    if fails_in == "accept":  # its logits processing raises at its third verified position
        bad.chooser = TokenChooser(FailingProcessor(at=3), do_sample=False)
    else:  # its drafter raises on its second draft

        class Failing(type(bad.drafter)):
            drafts = 0

            def propose(self, tokens, max_tokens):
                type(self).drafts += 1
                if self.drafts == 2:
                    raise KeyError("the drafter's internal state")
                return super().propose(tokens, max_tokens)

        bad.drafter.__class__ = Failing
    for _ in decoder.run():  # nothing raises: only the bad sequence ends
        pass
    assert bad.finish_reason == "error" and bad.error is not None
    assert bad.stats.new_tokens < 32
    for index in (0, 2, 3):
        assert sequences[index].tokens[len(prompts[index]) :] == want[index]
        assert sequences[index].finish_reason in ("stop", "length")


def test_a_failing_forward_pass_ends_the_step():
    target = TorchTarget(tiny_llama())
    decoder = BatchDecoder(target, None, max_batch=2)
    decoder.add(BatchSequence([3, 4, 5], 16))

    def failing(*_):
        raise RuntimeError("the pass failed")

    target.forward_batch = failing
    with pytest.raises(RuntimeError, match="the pass failed"):
        decoder.step()


class PlainTarget:
    """Only a :class:`~promptlookup.backends.base.Target` (as llama.cpp's): one sequence at a
    time in its own cache, no ``new_sequence`` or ``forward_batch``."""

    def __init__(self, inner) -> None:
        self.inner, self.max_context, self.can_crop = inner, inner.max_context, inner.can_crop

    def reset(self):
        self.inner.reset()

    def prefill(self, token_ids):
        self.inner.prefill(token_ids)

    def forward(self, token_ids):
        return self.inner.forward(token_ids)

    def crop(self, length):
        self.inner.crop(length)

    def prepare(self, sizes):
        self.inner.prepare(sizes)

    @property
    def cache_length(self):
        return self.inner.cache_length


def test_a_target_of_one_sequence_at_a_time_runs_on_the_batch_decoder_as_the_loop_does():
    target = PlainTarget(TorchTarget(tiny_llama(seed=2)))
    lm = promptlookup.LanguageModel(target, TinyTokenizer(32))
    for prompt in repetitive_prompts(2, 3):
        want = alone(target, prompt, drafter="prompt-lookup", eos=lm.eos_token_ids)
        got = lm.generate(prompt, max_new_tokens=32, speculation="fixed", prefix_cache=False)
        assert got.token_ids == want and got.stats.accepted_tokens > 0
    with pytest.raises(UnsupportedModelError):  # one sequence at a time: no batch of several
        BatchDecoder(target, max_batch=2)


def test_should_stop_ends_a_sequence_before_its_next_pass():
    target = TorchTarget(tiny_llama())
    decoder = BatchDecoder(target, None, max_batch=2)
    sequence = decoder.add(BatchSequence([3, 4, 5], 16, should_stop=lambda: True))
    assert list(decoder.run()) == [(sequence, [])]
    assert sequence.finish_reason == "cancelled" and sequence.stats.forward_passes == 0


def test_long_prompts_are_prefilled_in_chunks_while_others_decode(monkeypatch):
    target = TorchTarget(tiny_llama())
    passes: list[list[int]] = []
    real = target.forward_batch

    def spy(caches, token_ids, keep):
        passes.append([len(tokens) for tokens in token_ids])
        return real(caches, token_ids, keep)

    monkeypatch.setattr(target, "forward_batch", spy)
    short, long = [5, 6, 7], repetitive_prompts(5, 1)[0] * 3
    want = [alone(target, short, 20, drafter="none"), alone(target, long, 20, drafter="none")]
    got, _ = batched(target, [short, long], max_new_tokens=20, drafter="none", prefill_tokens=32)
    assert got == want
    # Once the short prompt decodes, each pass carries at most 32 of the long prompt's tokens.
    decoding = passes[1:]
    assert all(sizes[1] <= 32 + 1 for sizes in decoding if len(sizes) == 2)
    assert len(passes) >= len(long) // 32


def test_the_decoder_says_how_many_prompt_tokens_each_steps_pass_carried(monkeypatch):
    """``prompt_tokens_fed``: a pass's rows less the logits it kept (a decoding row and its
    draft's), so that the server gives a long prompt's freed transients back after it."""
    target = TorchTarget(tiny_llama())
    fed: list[int] = []
    real = target.forward_batch

    def spy(caches, token_ids, keep):
        fed.append(sum(map(len, token_ids)) - sum(keep))
        return real(caches, token_ids, keep)

    monkeypatch.setattr(target, "forward_batch", spy)
    decoder = BatchDecoder(target, SpeculationPolicy(), max_batch=2, prefill_tokens=32)
    for prompt in ([5, 6, 7], repetitive_prompts(5, 1)[0] * 3):
        decoder.add(
            BatchSequence(
                prompt,
                20,
                make_drafter("prompt-lookup"),
                TokenChooser.from_params(SamplingParams()),
            )
        )
    said = []
    while decoder.waiting or decoder.running:
        passes = len(fed)
        decoder.step()
        said.append((decoder.prompt_tokens_fed, fed[-1] if len(fed) > passes else 0))
    assert all(told == carried for told, carried in said)
    assert sum(told for told, _ in said) == 2 + len(repetitive_prompts(5, 1)[0]) * 3 - 1
    assert said[-1][0] == 0 and max(told for told, _ in said) > 0


def test_joint_decisions_spend_the_pass_on_the_most_trusted_drafts():
    policy = SpeculationPolicy()
    for n in (1, 2, 4, 8, 16, 32, 64):  # a flat cost curve: every draft token is nearly free
        for _ in range(3):
            policy.record_forward(n, 0.010 + 0.0001 * n)
    trusted, untrusted = AcceptanceModel(), AcceptanceModel()
    for _ in range(50):
        trusted.record(9, 16, 16)
        untrusted.record(1, 4, 0)
    lengths = policy.decide(
        [SequenceDraft(16, 40, trusted, False), SequenceDraft(4, 1, untrusted, False)]
    )
    assert lengths[0] == 16 and lengths[1] < 4
    for n in (1, 2, 4, 8, 16, 32, 64):  # now each token costs as much as a pass: no drafts
        for _ in range(30):
            policy.record_forward(n, 0.010 * n, batch_size=2)
    assert policy.decide(
        [SequenceDraft(16, 1, untrusted, False), SequenceDraft(4, 1, untrusted, False)]
    ) == [0, 0]


def test_generate_batch_equals_generate_prompt_by_prompt():
    lm = promptlookup.from_transformers(tiny_llama(seed=5), TinyTokenizer(32), name="tiny")
    prompts = ["abcabcabcabd" * k for k in range(1, 6)]
    for options in ({}, {"temperature": 0.8, "seed": 3, "logprobs": 2}, {"stop": ["ab"]}):
        one = [lm.generate(prompt, max_new_tokens=24, **options) for prompt in prompts]
        many = lm.generate_batch(prompts, max_new_tokens=24, max_batch=3, **options)
        chunked = lm.generate_batch(
            prompts, max_new_tokens=24, max_batch=3, prefill_tokens=4, **options
        )  # prompts 4 tokens a step while others decode
        assert [r.token_ids for r in chunked] == [r.token_ids for r in many]
        for a, b in zip(one, many):
            assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
            assert a.stats.new_tokens == b.stats.new_tokens
            assert [e.logprob for e in a.stats.logprobs] == [e.logprob for e in b.stats.logprobs]
    deltas = list(lm.stream_batch(prompts[:2], max_new_tokens=8))
    results = lm.generate_batch(prompts[:2], max_new_tokens=8)
    for index in (0, 1):
        assert "".join(piece for i, piece in deltas if i == index) == results[index].text


def test_a_stop_string_inside_a_step_leaves_the_steps_later_tokens_out_of_the_counts():
    """Alone (the loop's generator is closed at the stop) and in a batch (the sequence forgets
    them), the tokens a step accepted after a stop string are not counted: one step,
    loop.DecodingSequence, with the same counters either way."""
    lm = promptlookup.from_transformers(tiny_llama(seed=5), TinyTokenizer(32), name="tiny")
    prompts = ["abcabcabcabd" * k for k in (2, 5)]  # greedy: "jkkkk...", drafts accepted
    options = dict(max_new_tokens=24, speculation="fixed", logprobs=1)
    whole = [lm.generate(prompt, **options) for prompt in prompts]
    alone = [lm.generate(prompt, stop=["kkk"], **options) for prompt in prompts]
    batch = lm.generate_batch(prompts, stop=["kkk"], **options)
    for w, a, b in zip(whole, alone, batch):
        assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
        assert a.finish_reason == "stop" and a.token_ids == w.token_ids[: len(a.token_ids)]
        for stats in (a.stats, b.stats):
            counted = (stats.new_tokens, len(stats.logprobs), len(stats.token_seconds))
            assert counted == (len(a.token_ids),) * 3
            assert stats.accepted_tokens < w.stats.accepted_tokens
            # One bonus token per pass, but the last pass's may come after the stop.
            bonus = stats.new_tokens - stats.accepted_tokens
            assert bonus in (stats.forward_passes, stats.forward_passes - 1)
        assert (a.stats.accepted_tokens, a.stats.drafted_tokens, a.stats.forward_passes) == (
            b.stats.accepted_tokens,
            b.stats.drafted_tokens,
            b.stats.forward_passes,
        )


def test_generate_batch_checks_every_prompt_before_generating():
    lm = promptlookup.from_transformers(tiny_llama(), TinyTokenizer(32), name="tiny")
    with pytest.raises(promptlookup.errors.EmptyPromptError):
        lm.generate_batch(["abc", ""], max_new_tokens=4)
    with pytest.raises(InvalidParameterError):
        lm.generate_batch("abc", max_new_tokens=4)
    with pytest.raises(InvalidParameterError):
        BatchDecoder(lm.target, max_batch=0)
    with pytest.raises(InvalidParameterError, match="prefill_tokens"):
        lm.generate_batch(["abc"], max_new_tokens=4, prefill_tokens=0)


def test_generate_batch_needs_a_target_that_batches():
    class OneSequence:  # a Target without new_sequence / forward_batch
        max_context, can_crop = 64, True

    lm = promptlookup.LanguageModel(OneSequence(), TinyTokenizer(32))
    with pytest.raises(UnsupportedModelError):
        lm.generate_batch(["abc"], max_new_tokens=4)


def test_default_max_batch_is_bounded_by_cores_and_memory(monkeypatch):
    from promptlookup import machine

    target = TorchTarget(tiny_llama())
    monkeypatch.setattr(machine, "default_threads", lambda: 2)
    assert default_max_batch(target) == 8
    per_sequence = target.kv_bytes_per_token * target.max_context
    monkeypatch.setattr(machine, "memory_bytes", lambda: 4 * 3 * per_sequence)
    assert default_max_batch(target) == 3
