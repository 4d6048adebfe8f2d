"""The draft-model drafter: greedy identity with plain decoding, exact speculative sampling
(a goodness-of-fit test, and proof that it catches a broken rejection rule), cache sync,
adaptive draft length, and an end-to-end check on the real default model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from scipy.stats import chisquare

import promptlookup.rejection as rejection
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.drafters import (
    CallableDrafter,
    ChainDrafter,
    DraftModelDrafter,
    PromptLookupDrafter,
)
from promptlookup.drafters.draft_model import common_prefix_length
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.policy import NO_POLICY
from promptlookup.sampling import SamplingParams, TokenChooser, logits_processors

PROMPTS = [[3, 5, 7, 9, 2, 4], [1, 2, 3, 1, 2, 3, 1], [17, 4, 30, 8, 8, 12, 5, 21, 6]]


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(32, seed=0)


@pytest.fixture(scope="module")
def other_model():
    """A different random model over the same vocabulary: its drafts are often rejected."""
    return tiny_llama(32, seed=1)


@pytest.fixture(scope="module")
def twin_model():
    """The target's weights, built separately: its greedy drafts are always accepted."""
    return tiny_llama(32, seed=0)


@pytest.fixture(autouse=True)
def one_thread(request):
    """Tiny models run fastest on one thread (and the CPU is shared)."""
    if "default_lm" in request.fixturenames:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(model, prompt, drafter=None, chooser=None, max_new_tokens=32, policy=NO_POLICY):
    stats = GenerationStats()
    tokens = list(
        speculative_generate(
            TorchTarget(model),
            prompt,
            drafter=drafter,
            chooser=chooser,
            max_new_tokens=max_new_tokens,
            stats=stats,
            policy=policy,
        )
    )
    return tokens, stats


def greedy(repetition_penalty: float = 1.0) -> TokenChooser:
    return TokenChooser.from_params(SamplingParams(repetition_penalty=repetition_penalty))


# -- greedy: token-identical to plain decoding ---------------------------------------------------


@pytest.mark.parametrize("draft", ["other_model", "twin_model"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_draft_model_output_equals_plain_decoding(request, target_model, draft, prompt):
    plain, _ = run(target_model, prompt)
    out, stats = run(
        target_model,
        prompt,
        DraftModelDrafter(request.getfixturevalue(draft), confidence_threshold=0),
    )
    assert out == plain
    assert stats.drafted_tokens > 0
    if draft == "twin_model":  # same weights: every greedy draft token is accepted
        assert stats.acceptance_rate == 1.0 and stats.forward_passes < len(plain) / 2


def test_greedy_identity_with_repetition_penalty(target_model, other_model):
    chooser = greedy(repetition_penalty=1.3)
    for prompt in PROMPTS:
        plain, _ = run(target_model, prompt, chooser=chooser)
        drafter = DraftModelDrafter(other_model, confidence_threshold=0, chooser=chooser)
        assert run(target_model, prompt, drafter, chooser=chooser)[0] == plain


@pytest.mark.parametrize("draft", ["other_model", "twin_model"])
def test_chain_prompt_lookup_then_draft_model_equals_plain_decoding(request, target_model, draft):
    for prompt in PROMPTS:
        plain, _ = run(target_model, prompt)
        chain = ChainDrafter(
            [PromptLookupDrafter(), DraftModelDrafter(request.getfixturevalue(draft))]
        )
        out, stats = run(target_model, prompt, chain)
        assert out == plain and stats.drafted_tokens > 0


# -- the draft model's cache ------------------------------------------------------------------


class CheckedDraftModel(DraftModelDrafter):
    """Asserts that every draft from the kept, cropped cache equals a draft from scratch."""

    def propose(self, tokens, max_tokens):
        draft = super().propose(tokens, max_tokens)
        fresh = DraftModelDrafter(
            self.model,
            num_tokens=self.num_tokens,
            start_tokens=self.draft_length,
            confidence_threshold=0,
        )
        assert draft == fresh.propose(tokens, max_tokens)
        assert self.cached == list(tokens) + draft[:-1]
        assert self.cache.get_seq_length() == len(self.cached)
        self.proposals += 1
        return draft


def test_draft_model_stays_in_sync_when_a_chain_skips_it(target_model, other_model):
    """Every other step a drafter placed before it in the chain drafts (the right tokens), so
    the draft model must catch up on several accepted tokens it never saw."""
    prompt = PROMPTS[0]
    plain, _ = run(target_model, prompt)
    steps = iter(range(1000))

    def sometimes_right(tokens, max_tokens):
        done = len(tokens) - len(prompt)
        return plain[done : done + min(max_tokens, 3)] if next(steps) % 2 else []

    checked = CheckedDraftModel(other_model, confidence_threshold=0)
    checked.proposals = 0
    out, _ = run(target_model, prompt, ChainDrafter([CallableDrafter(sometimes_right), checked]))
    assert out == plain
    assert checked.proposals >= 5


def test_sync_crops_the_cache_to_the_common_prefix_and_feeds_the_rest(other_model):
    drafter = DraftModelDrafter(other_model, num_tokens=4, start_tokens=4, confidence_threshold=0)
    first = drafter.propose([1, 2, 3, 4, 5, 6], 4)
    assert drafter.cached == [1, 2, 3, 4, 5, 6] + first[:3]
    other = [1, 2, 3, 9, 9]  # diverges after 3 tokens: the cache keeps 3, then feeds 9, 9
    second = drafter.propose(other, 4)
    assert drafter.cached == other + second[:3]
    assert drafter.cache.get_seq_length() == len(drafter.cached)
    assert second == DraftModelDrafter(
        other_model, num_tokens=4, start_tokens=4, confidence_threshold=0
    ).propose(other, 4)


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 5, 4]) == 2
    assert common_prefix_length([7], [8]) == 0
    assert common_prefix_length([], [1]) == 0
    for n in range(1, 40):
        a = list(range(40))
        b = a[:n] + [-1] + a[n + 1 :]
        assert common_prefix_length(a, b) == n


# -- drafting policy --------------------------------------------------------------------------


def test_draft_length_grows_by_two_when_all_accepted_and_shrinks_by_one_otherwise(other_model):
    drafter = DraftModelDrafter(other_model, num_tokens=8, start_tokens=3)
    drafter.update([1, 2, 3], 3)
    assert drafter.draft_length == 5
    drafter.update([1, 2, 3, 4, 5], 5)
    assert drafter.draft_length == 7
    drafter.update([1, 2, 3, 4, 5, 6, 7], 7)
    assert drafter.draft_length == 8  # capped at num_tokens
    drafter.update([1, 2, 3], 1)
    assert drafter.draft_length == 7
    drafter.update([], 0)  # a step it did not draft changes nothing
    assert drafter.draft_length == 7
    for _ in range(10):
        drafter.update([1], 0)
    assert drafter.draft_length == 1  # never below one


def test_stops_drafting_after_a_low_confidence_token(other_model):
    tokens = [3, 5, 7, 9, 2, 4]
    sure = DraftModelDrafter(other_model, num_tokens=6, start_tokens=6, confidence_threshold=0)
    assert len(sure.propose(tokens, 6)) == 6
    unsure = DraftModelDrafter(other_model, num_tokens=6, start_tokens=6, confidence_threshold=1)
    assert len(unsure.propose(tokens, 6)) == 1  # the low-confidence token is still proposed


def test_stops_drafting_after_an_end_of_sequence_token(other_model):
    tokens = [3, 5, 7, 9, 2, 4]
    draft = DraftModelDrafter(
        other_model, num_tokens=6, start_tokens=6, confidence_threshold=0
    ).propose(tokens, 6)
    eos = draft[1]
    cut = DraftModelDrafter(
        other_model, num_tokens=6, start_tokens=6, confidence_threshold=0, eos_token_ids=[eos]
    ).propose(tokens, 6)
    assert cut == draft[: draft.index(eos) + 1]


def test_greedy_drafts_carry_no_draft_probabilities(other_model):
    drafter = DraftModelDrafter(other_model, chooser=greedy())
    draft = drafter.propose([1, 2, 3], 4)
    assert draft and draft.draft_probs is None


def test_sampled_drafts_carry_the_distributions_they_were_drawn_from(other_model):
    params = SamplingParams(temperature=0.8, top_k=20, repetition_penalty=1.2, seed=3)
    chooser = TokenChooser.from_params(params)
    drafter = DraftModelDrafter(
        other_model, num_tokens=4, start_tokens=4, confidence_threshold=0, chooser=chooser
    )
    tokens = [1, 2, 3, 4]
    draft = drafter.propose(tokens, 4)
    draft_probs = draft.draft_probs  # (len(draft), vocab)
    assert draft_probs.shape == (len(draft), 32)
    for i, token in enumerate(draft):
        prefix = torch.tensor([tokens + draft[:i]])
        with torch.no_grad():
            logits = other_model(prefix).logits[0, -1]  # (vocab,)
        expected = torch.softmax(logits_processors(params)(prefix, logits[None])[0], dim=-1)
        assert torch.allclose(draft_probs[i], expected, atol=1e-5)
        assert draft_probs[i][token] > 0


def test_chain_forwards_the_draft_probabilities_of_its_author(other_model):
    chooser = TokenChooser.from_params(SamplingParams(temperature=1.0, seed=0))
    model_drafter = DraftModelDrafter(other_model, chooser=chooser, confidence_threshold=0)
    chain = ChainDrafter([PromptLookupDrafter(), model_drafter])
    proposed = []
    propose = model_drafter.propose
    model_drafter.propose = lambda *args: proposed.append(propose(*args)) or proposed[-1]
    draft = chain.propose([5, 6, 7, 8], 4)  # no earlier occurrence: the draft model drafts
    assert draft and draft.draft_probs is not None and draft.draft_probs.shape == (len(draft), 32)
    assert draft.draft_probs is proposed[-1].draft_probs
    tokens = [5, 6, 7, 5, 6]
    draft = chain.propose(tokens, 4)
    assert draft == PromptLookupDrafter().propose(tokens, 4) and draft.draft_probs is None


def test_generate_samples_drafts_with_the_generation_settings(tiny_model):
    from conftest import TinyTokenizer

    import promptlookup

    lm = promptlookup.from_transformers(tiny_model, TinyTokenizer(32))
    drafter = DraftModelDrafter(tiny_llama(32, seed=1), confidence_threshold=0)
    drafts = []
    propose = drafter.propose
    drafter.propose = lambda *args: drafts.append(propose(*args)) or drafts[-1]
    result = lm.generate(
        [3, 5, 7, 9, 2],
        drafter=drafter,
        temperature=0.9,
        seed=5,
        max_new_tokens=12,
        speculation="fixed",
    )
    assert drafter.chooser is not None and drafter.chooser.do_sample
    assert result.stats.drafted_tokens > 0
    sampled = [draft for draft in drafts if draft]
    assert sampled and all(d.draft_probs.shape == (len(d), 32) for d in sampled)


# -- sampling: exactly the target's distribution ----------------------------------------------


class MemoTarget:
    """A test double of the target backend with the same logits, memoised per prefix: the
    statistical tests below draw thousands of short samples from one prompt."""

    max_context = 512
    can_crop = True

    def __init__(self, model) -> None:
        self.model, self.memo, self.tokens = model, {}, []

    def reset(self) -> None:
        self.tokens = []

    def prefill(self, token_ids) -> None:
        self.tokens += list(token_ids)

    def crop(self, length: int) -> None:
        del self.tokens[length:]

    def prepare(self, sizes) -> None:  # nothing to set up
        pass

    @property
    def cache_length(self) -> int:
        return len(self.tokens)

    def forward(self, token_ids) -> torch.Tensor:
        rows = []
        for token in token_ids:
            self.tokens.append(token)
            key = tuple(self.tokens)
            if key not in self.memo:
                with torch.inference_mode():
                    self.memo[key] = self.model(torch.tensor([self.tokens])).logits[0, -1].float()
            rows.append(self.memo[key])
        return torch.stack(rows)  # (len(token_ids), vocab)


VOCAB = 8
SAMPLING = dict(temperature=0.8, top_p=0.95, repetition_penalty=1.3)
STAT_PROMPT = [1, 2, 3]


def target_distribution(model, tokens) -> np.ndarray:
    """The target's exact sampling distribution (vocab,) after ``tokens``."""
    prefix = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(prefix).logits[0, -1]
    scores = logits_processors(SamplingParams(**SAMPLING))(prefix, logits[None].float())
    return torch.softmax(scores[0].double(), dim=-1).numpy()


def exact_first_tokens(model):
    """P(first two tokens) (vocab, vocab) and P(third token) (vocab,) under plain sampling."""
    first = target_distribution(model, STAT_PROMPT)
    pairs = np.array(
        [first[a] * target_distribution(model, STAT_PROMPT + [a]) for a in range(VOCAB)]
    )
    third = sum(
        pairs[a, b] * target_distribution(model, STAT_PROMPT + [a, b])
        for a in range(VOCAB)
        for b in range(VOCAB)
    )
    return pairs, third


def sample_first_tokens(target_model, draft_model, runs: int):
    """Counts of the first two tokens (vocab, vocab) and of the third (vocab,) over ``runs``
    seeds, with 2-token sampled drafts (so both verified positions and, after a rejection,
    a 1-token draft and its bonus token are exercised)."""
    target = MemoTarget(target_model)
    drafter = DraftModelDrafter(draft_model, num_tokens=2, start_tokens=2, confidence_threshold=0)
    pairs, third = np.zeros((VOCAB, VOCAB)), np.zeros(VOCAB)
    rejected = 0
    for seed in range(runs):
        chooser = TokenChooser.from_params(SamplingParams(**SAMPLING, seed=seed))
        drafter.chooser, drafter.draft_length = chooser, 2
        stats = GenerationStats()
        out = list(
            speculative_generate(
                target, STAT_PROMPT, max_new_tokens=3, drafter=drafter, chooser=chooser, stats=stats
            )
        )
        pairs[out[0], out[1]] += 1
        third[out[2]] += 1
        rejected += stats.accepted_tokens < stats.drafted_tokens
    assert rejected > runs / 4, "the test needs drafts that are often rejected"
    return pairs, third


def goodness_of_fit(observed: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against exact probabilities; cells expecting fewer than 5
    are pooled; impossible cells must stay empty."""
    observed, probs = observed.ravel(), probs.ravel() / probs.sum()
    assert observed[probs == 0].sum() == 0, "sampled a token the target gives probability 0"
    expected = probs[probs > 0] * observed.sum()
    observed = observed[probs > 0]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(chisquare(observed, expected).pvalue)


RUNS = 600


@pytest.fixture(scope="module")
def stat_models():
    return tiny_llama(VOCAB, seed=0, layers=1), tiny_llama(VOCAB, seed=1, layers=1)


def test_sampled_drafts_keep_the_target_distribution_exactly(stat_models):
    target_model, draft_model = stat_models
    exact_pairs, exact_third = exact_first_tokens(target_model)
    pairs, third = sample_first_tokens(target_model, draft_model, RUNS)
    assert goodness_of_fit(pairs, exact_pairs) > 1e-3
    assert goodness_of_fit(third, exact_third) > 1e-3


def test_goodness_of_fit_detects_a_broken_rejection_rule(stat_models, monkeypatch):
    """The classic mistake: after a rejection, resampling from the target's distribution
    instead of the residual. The same test as above must reject it."""
    target_model, draft_model = stat_models
    exact_pairs, _ = exact_first_tokens(target_model)
    monkeypatch.setattr(
        rejection, "residual_distribution", lambda target_probs, draft_probs: target_probs
    )
    pairs, _ = sample_first_tokens(target_model, draft_model, RUNS)
    assert goodness_of_fit(pairs, exact_pairs) < 1e-6


# -- the real default model -------------------------------------------------------------------

CHAT_PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


@pytest.fixture(scope="module")
def plain_default(default_lm):
    result = default_lm.generate(CHAT_PROMPT, drafter="none", max_new_tokens=64)
    assert len(result.token_ids) == 64
    return result


@pytest.mark.slow
def test_default_model_as_its_own_draft_model_accepts_nearly_every_draft(default_lm, plain_default):
    """A second load of the default model drafts for it: in float32 greedy decoding its drafts
    match, so any cache mistake (a stale or missing position) shows as rejections."""
    drafted = default_lm.generate(
        CHAT_PROMPT, drafter="draft-model:default", max_new_tokens=64, speculation="fixed"
    )  # every draft verified whole
    assert drafted.token_ids == plain_default.token_ids
    assert drafted.stats.drafted_tokens >= 32
    assert drafted.stats.acceptance_rate >= 0.95
    assert drafted.stats.forward_passes < plain_default.stats.forward_passes / 2


@pytest.mark.slow
def test_default_model_chain_greedy_identity(default_lm, plain_default):
    chained = default_lm.generate(
        CHAT_PROMPT,
        drafter="prompt-lookup,draft-model:default",
        max_new_tokens=64,
        speculation="fixed",
    )
    assert chained.token_ids == plain_default.token_ids
    assert chained.stats.drafted_tokens > 0


def test_draft_length_is_capped_by_the_policy_given_the_measured_cost_per_draft_token(other_model):
    class Policy:
        def __init__(self, worth):
            self.worth, self.asked = worth, []

        def worth_drafting(self, seconds_per_draft_token, limit):
            self.asked.append((seconds_per_draft_token, limit))
            return min(self.worth, limit)

    tokens = [3, 5, 7, 9, 2, 4]
    drafter = DraftModelDrafter(other_model, num_tokens=6, start_tokens=6, confidence_threshold=0)
    drafter.policy = Policy(worth=2)
    assert len(drafter.propose(tokens, 6)) == 6  # no cost measured yet: its own length
    assert drafter.seconds_per_token is not None and drafter.seconds_per_token > 0
    assert len(drafter.propose(tokens, 6)) == 2
    seconds, limit = drafter.policy.asked[-1]
    assert seconds > 0 and limit == 6
    drafter.policy = Policy(worth=0)  # drafting does not pay: a plain step
    assert drafter.propose(tokens, 6) == []


def test_cost_aware_draft_model_keeps_greedy_output_identical(target_model, other_model):
    from promptlookup.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    for prompt in PROMPTS:
        plain, _ = run(target_model, prompt)
        drafter = DraftModelDrafter(other_model, confidence_threshold=0)
        assert run(target_model, prompt, drafter, policy=policy)[0] == plain
