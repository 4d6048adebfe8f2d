"""Sampling is exact: with a drafter, the loop samples from the target's own distribution.

Checked statistically on a tiny model with an 8-token vocabulary: the joint distribution of
the first two sampled tokens, over many seeds, with a drafter that always proposes the same
plausible draft (so acceptances and rejections both happen), is compared with the drafter-free
samples (chi-square two-sample test) and with the exact distribution computed from the model's
probabilities (chi-square goodness of fit). A deliberately broken acceptance rule must fail the
same tests. Seeded sampling is also checked token for token: same seed, same tokens, with or
without a drafter, and the same as ``transformers``' ``model.generate(do_sample=True)``.
"""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import numpy as np
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import TinyTokenizer, tiny_llama
from scipy.stats import chi2_contingency, chisquare

import promptlookup
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.drafters import CallableDrafter, NoDrafter, PromptLookupDrafter
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.sampling import SamplingParams, TokenChooser, logits_processors

VOCAB = 8
PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
SAMPLES = 1200  # generations per arm (a broken rule gives p ~ 1e-30 at this size)
P_MIN = 0.001

CONFIGS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k_top_p_penalty": SamplingParams(
        temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2
    ),
}


class MemoTarget:
    """The tiny model as a :class:`~promptlookup.backends.base.Target` that remembers the
    logits of every prefix it has seen (each computed once by a full forward pass): thousands
    of short generations then cost almost nothing. (The KV-cache backend itself is checked by
    the token-for-token tests below and in test_loop_greedy.py.)"""

    max_context = 512
    can_crop = True

    def __init__(self, model) -> None:
        self.model = model
        self.fed: list[int] = []
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def reset(self) -> None:
        self.fed = []

    def prefill(self, token_ids) -> None:
        self.fed.extend(token_ids)

    def forward(self, token_ids) -> torch.Tensor:
        rows = []
        for token in token_ids:
            self.fed.append(token)
            rows.append(self.next_logits(tuple(self.fed)))
        return torch.stack(rows)  # (len(token_ids), vocab)

    def crop(self, length: int) -> None:
        del self.fed[length:]

    def prepare(self, sizes) -> None:  # nothing to set up
        pass

    @property
    def cache_length(self) -> int:
        return len(self.fed)

    def next_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.memo:
            with torch.no_grad():
                self.memo[prefix] = self.model(torch.tensor([prefix])).logits[0, -1].float()
        return self.memo[prefix]  # (vocab,)


@functools.cache
def memo_target() -> MemoTarget:
    return MemoTarget(tiny_llama(vocab_size=VOCAB, seed=1))


def processed_probs(
    params: SamplingParams, prefix: list[int], logits: torch.Tensor
) -> torch.Tensor:
    """The target's sampling distribution after ``prefix``: (vocab,)."""
    scores = logits_processors(params)(torch.tensor([prefix]), logits[None])  # (1, vocab)
    return torch.softmax(scores[0], dim=-1)


def exact_joint(params: SamplingParams) -> np.ndarray:
    """P(token1, token2) after PROMPT: (vocab, vocab)."""
    target = memo_target()
    first = processed_probs(params, PROMPT, target.next_logits(tuple(PROMPT)))
    joint = np.zeros((VOCAB, VOCAB))
    for t1 in range(VOCAB):
        prefix = PROMPT + [t1]
        joint[t1] = (
            first[t1].item()
            * processed_probs(params, prefix, target.next_logits(tuple(prefix))).numpy()
        )
    return joint


def likely_draft(params: SamplingParams) -> list[int]:
    """The most likely first token and the most likely second token after it."""
    joint = exact_joint(params)
    first = int(joint.sum(axis=1).argmax())
    return [first, int(joint[first].argmax())]


def sample_pairs(params: SamplingParams, seeds, drafter_factory, chooser_factory=None):
    """Counts of (token1, token2) over one generation per seed: (vocab, vocab); and the summed
    stats."""
    target = memo_target()
    counts = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    total = GenerationStats()
    for seed in seeds:
        drafter = drafter_factory()
        chooser = TokenChooser.from_params(replace(params, seed=seed))
        if chooser_factory is not None:
            chooser = chooser_factory(chooser, drafter)
        stats = GenerationStats()
        # max_new_tokens=3 leaves room for a 2-token draft in the first forward pass.
        tokens = list(
            speculative_generate(
                target, PROMPT, max_new_tokens=3, drafter=drafter, chooser=chooser, stats=stats
            )
        )
        counts[tokens[0], tokens[1]] += 1
        total.drafted_tokens += stats.drafted_tokens
        total.accepted_tokens += stats.accepted_tokens
    return counts, total


def cells(expected: np.ndarray):
    """Cell groups for chi-square: each cell expected >= 5 times on its own, the rest pooled."""
    flat = expected.ravel()
    big = np.flatnonzero(flat >= 5)
    small = np.flatnonzero((flat < 5) & (flat > 0))
    zero = np.flatnonzero(flat == 0)
    return big, small, zero


def goodness_of_fit(counts: np.ndarray, joint: np.ndarray) -> float:
    n = counts.sum()
    big, small, zero = cells(joint * n)
    observed, expected = counts.ravel(), (joint * n).ravel()
    assert observed[zero].sum() == 0, "sampled a token of probability zero"
    obs = np.append(observed[big], observed[small].sum()) if len(small) else observed[big]
    exp = np.append(expected[big], expected[small].sum()) if len(small) else expected[big]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def two_sample(counts_a: np.ndarray, counts_b: np.ndarray, joint: np.ndarray) -> float:
    big, small, _ = cells(joint * counts_a.sum())
    rows = []
    for counts in (counts_a, counts_b):
        flat = counts.ravel()
        rows.append(np.append(flat[big], flat[small].sum()) if len(small) else flat[big])
    table = np.array(rows)
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table).pvalue


def fixed_drafter(draft):
    return lambda: CallableDrafter(lambda tokens, max_tokens: list(draft))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_sampled_distribution_is_exact(config):
    params = CONFIGS[config]
    joint = exact_joint(params)
    draft = likely_draft(params)
    drafted, stats = sample_pairs(params, range(SAMPLES), fixed_drafter(draft))
    plain, plain_stats = sample_pairs(params, range(SAMPLES, 2 * SAMPLES), NoDrafter)
    # The drafter's guess was checked both ways: some tokens accepted, some rejected.
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert plain_stats.drafted_tokens == 0
    assert two_sample(drafted, plain, joint) > P_MIN
    assert goodness_of_fit(drafted, joint) > P_MIN
    assert goodness_of_fit(plain, joint) > P_MIN


class SkipsTheTargetsDraw:
    """A broken verifier: accepts the draft token with its target probability, but after a
    rejection samples from the full target distribution instead of the rest of it, so the
    draft token is over-represented (a classic speculative-sampling bug)."""

    def __init__(self, chooser: TokenChooser, drafter: CallableDrafter) -> None:
        self.chooser, self.drafter = chooser, drafter
        self.processors, self.do_sample, self.generator = (
            chooser.processors,
            True,
            chooser.generator,
        )
        self.plain_argmax = False

    def choose(self, input_ids: torch.Tensor, target_logits: torch.Tensor) -> int:
        position = input_ids.shape[1] - len(PROMPT)
        draft = self.drafter.function(None, None)
        scores = self.processors(input_ids, target_logits[None].float())  # (1, vocab)
        target_probs = torch.softmax(scores[0], dim=-1)  # (vocab,)
        if position < len(draft):
            u = torch.rand((), generator=self.generator).item()
            if u < target_probs[draft[position]].item():
                return draft[position]
        return int(torch.multinomial(target_probs, 1, generator=self.generator))


def test_the_statistical_test_detects_a_broken_acceptance_rule():
    params = CONFIGS["temperature"]
    joint = exact_joint(params)
    draft = likely_draft(params)
    broken, stats = sample_pairs(params, range(SAMPLES), fixed_drafter(draft), SkipsTheTargetsDraw)
    assert stats.accepted_tokens > 0
    plain, _ = sample_pairs(params, range(SAMPLES, 2 * SAMPLES), NoDrafter)
    assert goodness_of_fit(broken, joint) < 1e-6
    assert two_sample(broken, plain, joint) < 1e-6


# -- token for token, with seeds (the real KV-cache backend) --------------------------------------

SEEDED = {
    "temperature": dict(temperature=1.0),
    "top_k_top_p": dict(temperature=0.7, top_k=5, top_p=0.9),
    "penalty": dict(temperature=1.0, repetition_penalty=1.3),
}


@functools.cache
def tiny_lm():
    return promptlookup.from_transformers(tiny_llama(vocab_size=32, seed=3), TinyTokenizer(32))


def repeated_prompt(seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 32) for _ in range(12)] * 3


@pytest.mark.parametrize("config", sorted(SEEDED))
def test_same_seed_same_tokens_with_or_without_drafter(config):
    """The loop draws one random number per generated token, in plain decoding's order, so a
    seed fixes the output whatever the drafter."""
    lm, prompt = tiny_lm(), repeated_prompt()
    kwargs = dict(max_new_tokens=40, seed=1234, **SEEDED[config])
    first = lm.generate(prompt, drafter="prompt-lookup", **kwargs)
    again = lm.generate(prompt, drafter="prompt-lookup", **kwargs)
    plain = lm.generate(prompt, drafter="none", **kwargs)
    assert first.token_ids == again.token_ids == plain.token_ids
    assert len(first.token_ids) > 1
    others = {
        tuple(lm.generate(prompt, drafter="none", **{**kwargs, "seed": s}).token_ids)
        for s in range(3)
    }
    assert len(others | {tuple(plain.token_ids)}) > 1, "the seed changes nothing: not sampling?"


@pytest.mark.parametrize("config", sorted(SEEDED))
def test_seeded_sampling_equals_transformers_with_the_same_seed(config):
    """Same processors, same order, one ``torch.multinomial`` per token: our seeded sample is
    ``model.generate(do_sample=True)``'s after ``torch.manual_seed(seed)``."""
    model, prompt = tiny_lm().model, repeated_prompt()
    options = SEEDED[config]
    stats = GenerationStats()
    chooser = TokenChooser.from_params(SamplingParams(seed=99, **options))
    ours = list(
        speculative_generate(
            TorchTarget(model),
            prompt,
            max_new_tokens=30,
            drafter=PromptLookupDrafter(num_tokens=8),
            chooser=chooser,
            stats=stats,
        )
    )
    assert stats.drafted_tokens > 0
    torch.manual_seed(99)
    input_ids = torch.tensor([prompt])  # (1, len(prompt))
    hf_options = {"top_k": 0, "top_p": 1.0, **options}  # transformers' default top_k is 50
    theirs = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=True,
        max_new_tokens=30,
        eos_token_id=None,
        pad_token_id=0,
        **hf_options,
    )[0, len(prompt) :].tolist()
    assert ours == theirs
