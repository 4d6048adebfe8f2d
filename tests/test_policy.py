"""The cost-aware speculation policy: its decisions, and that it never changes the output."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import TinyTokenizer, tiny_llama

import promptlookup as pl
from promptlookup.calibration import calibrate, time_passes
from promptlookup.cost_model import CostModel
from promptlookup.cost_store import CostStore, context_bucket
from promptlookup.drafters.base import Draft
from promptlookup.policy import (
    NO_POLICY,
    SequenceDraft,
    Speculation,
    SpeculationPolicy,
    match_bucket,
    prior_acceptance,
)


def policy_with_costs(costs: dict[int, float], exploration: float = 0.0) -> SpeculationPolicy:
    policy = SpeculationPolicy(exploration=exploration)
    for size, seconds in costs.items():
        policy.record_forward(size, seconds)
    return policy


def verified(speculation: Speculation, length: int, match_length: int | None) -> int:
    """How many tokens of a ``length``-token draft found by ``match_length`` the policy keeps
    for the request ``speculation`` stands for."""
    return len(speculation.shape(Draft([5] * length, match_length=match_length)))


def test_cost_model_joins_the_medians_of_measured_sizes():
    model = CostModel()
    model.record(1, 2.0)
    for seconds in (3.0, 3.0, 90.0):  # one outlier: medians per size resist it
        model.record(2, seconds)
    model.record(10, 7.0)
    assert model.cost(1) == 2.0
    assert model.cost(2) == 3.0 and model.cost(10) == 7.0
    assert model.cost(6) == 5.0  # on the segment from (2, 3) to (10, 7)
    assert model.cost(20) == 12.0  # extrapolated with the line's slope
    for _ in range(30):  # a size measured often, off that line, is believed
        model.record(4, 3.0)
    assert abs(model.cost(4) - 3.0) < 0.1 and model.cost(4) < 4.0


def test_cost_model_believes_a_few_tokens_can_cost_less_than_one():
    # float32 on this project's CPUs: 2 tokens cost ~0.8x one.
    model = CostModel()
    for n, seconds in ((1, 1.0), (2, 0.8), (4, 1.1), (8, 1.9)):
        for _ in range(5):
            model.record(n, seconds)
    assert model.cost(2) < model.cost(1) and abs(model.cost(2) - 0.8) < 0.05


def test_one_noisy_pass_bends_the_curve_only_a_little():
    model = CostModel()
    for n, seconds in ((1, 1.0), (2, 1.0), (4, 1.1), (8, 1.4)):
        for _ in range(10):
            model.record(n, seconds)
    model.record(6, 5.0)  # a hiccup: the only pass of 6 tokens so far
    assert model.cost(6) < 2.5  # under half of it
    model.record(6, 1.25)
    model.record(6, 1.25)  # two ordinary passes: the median forgets the hiccup
    assert model.cost(4) < model.cost(6) < model.cost(8)


def test_the_first_pass_sets_the_scale_even_after_the_level_was_read():
    model = CostModel()
    assert model.level == 1.0  # before any pass
    model.record(1, 0.05)
    model.record(8, 0.06)
    model.record(16, 0.07)
    assert abs(model.cost(1) - 0.05) < 1e-12 and abs(model.cost(8) - 0.06) < 1e-12


def test_cost_model_keeps_estimates_physically_plausible():
    model = CostModel()
    model.record(1, 1.0)
    model.record(2, 0.1)  # "ten times cheaper than one token": noise
    model.record(4, 100.0)  # "dearer than four separate passes": noise
    for n in range(1, 40):
        assert 0.5 <= model.cost(n) <= n * 1.0


def test_cost_model_keeps_each_size_until_remeasured():
    model = CostModel(window=4)
    for n, seconds in ((1, 1.0), (2, 1.5), (16, 4.0)):
        model.record(n, seconds)
    for _ in range(50):  # the policy now verifies only 2-token passes
        model.record(2, 1.2)
    # 16 tokens keep their cost relative to one token; 2 tokens now cost what they measure.
    assert abs(model.cost(16) / model.cost(1) - 4.0) < 1e-9 and abs(model.cost(2) - 1.2) < 1e-9


SHAPE = {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1, 16: 1.2, 32: 1.5, 64: 1.9}  # bfloat16 on the Xeon


def test_a_slow_spell_moves_the_level_not_the_shape():
    # Measured on a shared Xeon: for tens of seconds every pass runs ~1.7x slower. Passes timed
    # during the spell must not make the sizes measured then look dearer than the others.
    model = CostModel()
    for _ in range(4):
        for n, shape in SHAPE.items():
            model.record(n, 0.06 * shape)
    shape_before = {n: model.cost(n) / model.cost(1) for n in range(1, 65)}
    for _ in range(40):  # the spell, during which the policy happens to use only 1 and 8
        model.record(1, 0.06 * 1.7)
        model.record(8, 0.06 * 1.7 * 1.1)
    for n in range(1, 65):
        assert abs(model.cost(n) / model.cost(1) - shape_before[n]) < 0.01
    assert abs(model.cost(1) / (0.06 * 1.7) - 1) < 0.01  # the level followed the spell
    for _ in range(40):  # the spell ends
        model.record(16, 0.06 * 1.2)
    assert abs(model.cost(8) / model.cost(1) - 1.1) < 0.01 and abs(model.cost(1) / 0.06 - 1) < 0.01


class ClockedTarget:
    """A stand-in target whose passes advance a fake clock by ``level * SHAPE[n]``; the level
    rises 1.7x after ``spell_after`` passes (no sleeping)."""

    def __init__(self, spell_after: int) -> None:
        self.now, self.passes, self.spell_after = 0.0, 0, spell_after
        self.cache_length, self.max_context = 100, 10_000

    def forward(self, token_ids):
        self.passes += 1
        self.now += 0.06 * (1.7 if self.passes > self.spell_after else 1.0) * SHAPE[len(token_ids)]

    def crop(self, length):
        self.cache_length = length

    def prepare(self, sizes):  # nothing to set up
        pass


def test_calibration_measures_each_size_against_the_one_token_pass_before_it(monkeypatch):
    import promptlookup.calibration as calibration_module

    target = ClockedTarget(spell_after=6)  # the warm-up, one pass, then 1+2 and 1+4: a spell
    monkeypatch.setattr(calibration_module.time, "perf_counter", lambda: target.now)
    store = CostStore()
    store.record_calibration(100, time_passes(target, 5, sorted(SHAPE), repeats=3))
    model = store.curve(100)
    assert target.cache_length == 100 and model.calibrated
    for n, shape in SHAPE.items():  # every timing of n tokens, over the one-token pass before it
        assert all(abs(ratio - shape) < 1e-9 for ratio in model.samples[n])
        assert abs(model.cost(n) / model.cost(1) - shape) < 0.05  # (shrunk towards a line)


def test_a_uniform_slowdown_does_not_change_the_policy():
    policy = policy_with_costs({})
    for _ in range(3):
        for n, shape in SHAPE.items():
            policy.record_forward(n, 0.06 * shape)
    request = Speculation(policy)
    before = [verified(request, 40, match) for match in (1, 2, 3, 8, 20)]
    for _ in range(10):
        for n in (1, 8, 32):
            policy.record_forward(n, 0.06 * 1.7 * SHAPE[n])
    assert [verified(request, 40, match) for match in (1, 2, 3, 8, 20)] == before


def test_cost_model_survives_a_round_trip_to_disk(tmp_path):
    model = CostModel()
    for n, seconds in ((1, 1.0), (2, 2.0), (8, 3.0)):
        model.record(n, seconds)
    model.save(tmp_path / "costs.json")
    loaded = CostModel()
    loaded.load(tmp_path / "costs.json")
    assert [loaded.cost(n) for n in range(1, 20)] == [model.cost(n) for n in range(1, 20)]
    (tmp_path / "bad.json").write_text("{not json")
    corrupt = CostModel()
    corrupt.load(tmp_path / "bad.json")
    assert not corrupt.calibrated


def test_cost_model_reads_the_seconds_files_of_earlier_versions(tmp_path):
    # 0.6.4 and earlier stored seconds; the replay's committed cost files are of that format.
    legacy = {"plain": [1.0, 1.2, 1.1], "verify": [[2, 1.5], [2, 1.6], [8, 2.2], [8, 2.2]]}
    (tmp_path / "old.json").write_text(json.dumps(legacy))
    model = CostModel()
    model.load(tmp_path / "old.json")
    assert model.calibrated and abs(model.cost(1) - 1.1) < 1e-9
    assert abs(model.cost(8) / model.cost(1) - 2.0) < 0.2  # 2.2 s over 1.1 s, shrunk a little


def test_drafts_nothing_when_verification_is_expensive_and_acceptance_unknown():
    # Linear cost (like float32 on a CPU): a 1-token match is not worth one extra token.
    policy = policy_with_costs({1: 1.0, 2: 2.0, 8: 8.0, 64: 64.0})
    assert verified(Speculation(policy), 10, match_length=1) == 0


def test_drafts_the_whole_draft_when_verification_is_nearly_free():
    # Flat cost (like bfloat16 on a CPU, or a GPU): any draft with some chance pays.
    policy = policy_with_costs({1: 1.0, 64: 1.05})
    assert verified(Speculation(policy), 20, match_length=16) == 20


def test_drafts_more_after_long_matches_than_short_ones():
    request = Speculation(policy_with_costs({1: 1.0, 2: 1.6, 4: 1.8, 8: 2.2, 16: 3.0, 64: 9.0}))
    assert verified(request, 40, match_length=32) > verified(request, 40, match_length=2)


def test_learns_to_stop_drafting_when_drafts_are_rejected():
    request = Speculation(policy_with_costs({1: 1.0, 2: 1.5, 16: 2.0, 64: 4.0}))
    assert verified(request, 16, match_length=8) > 0
    for _ in range(50):
        request.policy.learn(request.entry(16, 8), num_accepted=0)
    assert verified(request, 16, match_length=8) == 0


def test_learns_to_draft_when_drafts_are_accepted():
    request = Speculation(policy_with_costs({1: 1.0, 2: 2.0, 16: 2.2, 64: 6.0}))
    assert verified(request, 16, match_length=1) == 0
    for _ in range(50):
        request.policy.learn(request.entry(16, 1), num_accepted=16)
    assert verified(request, 16, match_length=1) == 16


def test_greedy_and_sampling_keep_separate_statistics():
    policy = policy_with_costs({1: 1.0, 2: 1.5, 16: 2.0, 64: 4.0})
    sampled = Speculation(policy, sampling=True)
    for _ in range(50):
        policy.learn(sampled.entry(16, 8), num_accepted=0)
    assert verified(sampled, 16, match_length=8) == 0
    assert verified(Speculation(policy, sampling=False), 16, match_length=8) > 0


def test_the_policy_keeps_no_state_of_a_request():
    """A request's own statistics live with it: a request whose drafts were all rejected drafts
    less than a new one, whose statistics start from the history alone."""
    policy = policy_with_costs({1: 1.0, 2: 1.5, 16: 2.0, 64: 4.0})
    failing = Speculation(policy)
    for _ in range(6):
        policy.learn(failing.entry(16, 8), num_accepted=0)
    assert verified(failing, 16, 8) < verified(Speculation(policy), 16, 8)
    assert failing.acceptance.evidence(match_bucket(8), 1) == 6


def test_one_rule_sizes_drafts_alone_in_a_batch_and_for_draft_models():
    """A request's shape and worth_drafting are decide for one sequence, and that is the
    argmax over k of (1 + E[accepted | k]) / (cost(k + 1) + k * draft cost)."""
    rng = random.Random(3)
    for _ in range(30):
        costs = {1: 1.0, 2: 1 + rng.random(), 8: 2 + 4 * rng.random(), 64: 10 + 40 * rng.random()}
        exploration = rng.choice([0.0, 0.5])
        policy = policy_with_costs(costs, exploration=exploration)
        request = Speculation(policy)
        match, draft_seconds = rng.choice([None, 1, 4, 20]), rng.choice([0.0, 0.1])
        for _ in range(rng.randint(0, 30)):
            drafted = rng.randint(1, 16)
            policy.learn(request.entry(drafted, match), rng.randint(0, drafted))
        length = rng.randint(1, 20)
        # The rule written out: the request's own counts over the history's (the same counts
        # here) over the prior, plus the exploration bonus, against the measured curve.
        curve = CostModel()
        for size, seconds in costs.items():
            curve.record(size, seconds)

        def rate(k, match=match, draft_seconds=draft_seconds, request=request, curve=curve,
                 exploration=exploration):  # fmt: skip
            expected = survive = 1.0
            bucket = match_bucket(match)
            for position in range(1, k + 1):
                own = request.acceptance
                history = own.rate(bucket, position, prior_acceptance(bucket), 3.0)
                a = own.rate(bucket, position, history, 4.0)
                evidence = 2 * own.evidence(bucket, position)
                a += exploration * (a * (1 - a) / (evidence + 1)) ** 0.5
                survive *= min(a, 0.999)
                if survive < 1e-3:
                    break
                expected += survive
            return expected / (curve.cost(k + 1) + k * draft_seconds)

        best = max(range(length + 1), key=lambda k: (rate(k), -k))  # the shortest of ties
        alone = SequenceDraft(length, match, request.acceptance, False)
        assert policy.decide([alone], draft_seconds=draft_seconds) == [best]
        if draft_seconds == 0:
            assert verified(request, length, match) == best
        if match is None:
            assert request.worth_drafting(draft_seconds, limit=length) == best


def test_explores_while_evidence_is_thin_then_follows_the_evidence():
    costs = {1: 1.0, 2: 2.0, 8: 2.6}
    cautious = Speculation(policy_with_costs(costs, exploration=0.0))
    curious = Speculation(policy_with_costs(costs, exploration=0.5))
    assert verified(cautious, 7, match_length=2) == 0
    assert verified(curious, 7, match_length=2) > 0  # worth a try
    for _ in range(200):
        curious.policy.learn(curious.entry(7, 2), num_accepted=0)
    assert verified(curious, 7, match_length=2) == 0  # tried: it does not pay


def test_match_buckets_are_monotone():
    buckets = [match_bucket(n) for n in range(1, 100)]
    assert buckets == sorted(buckets) and match_bucket(None) == 0


def test_calibration_leaves_the_cache_as_it_was():
    model = tiny_llama(seed=3)
    target = pl.from_transformers(model, TinyTokenizer(32)).target
    target.reset()
    prompt = list(range(1, 20))
    target.extend(prompt)
    before = target.forward([7]).clone()
    target.crop(len(prompt))
    time_passes(target, 7, (1, 2, 5), repeats=1)
    assert target.cache_length == len(prompt)
    assert torch.equal(target.forward([7]), before)
    # Right after a prefill (as a request starts), with the prompt's last chunk still waiting:
    target.reset()
    target.prefill(prompt)
    time_passes(target, 7, (1, 2, 5), repeats=1)
    assert target.cache_length == len(prompt)
    assert torch.allclose(target.forward([7]), before, atol=1e-5, rtol=0)


class RandomLengthPolicy(SpeculationPolicy):
    """Verifies a random prefix of each draft: any choice of length must be lossless."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def calibration_plan(self, context):  # no calibration needed
        return (), 0

    def decide(self, drafts, fixed_tokens=0, draft_seconds=0.0, weights=None):
        return [self.rng.randint(0, draft.length) for draft in drafts]


def test_any_draft_length_choice_keeps_greedy_output_identical():
    model = tiny_llama(seed=1)
    lm = pl.from_transformers(model, TinyTokenizer(32))
    rng = random.Random(0)
    for trial in range(4):
        prompt = [rng.randrange(1, 32) for _ in range(10)] * 4
        plain = lm.generate(prompt, max_new_tokens=40, drafter="none").token_ids
        lm.policy = RandomLengthPolicy(seed=trial)
        result = lm.generate(prompt, max_new_tokens=40)
        assert result.token_ids == plain
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
        assert expected[0, len(prompt) :].tolist() == plain


def test_default_generation_uses_the_adaptive_policy_and_stays_identical():
    model = tiny_llama(seed=2)
    lm = pl.from_transformers(model, TinyTokenizer(32))
    prompt = list(range(1, 13)) * 4
    plain = lm.generate(prompt, max_new_tokens=48, drafter="none")
    adaptive = lm.generate(prompt, max_new_tokens=48)
    assert adaptive.token_ids == plain.token_ids
    assert lm.policy.calibrated  # calibrated on first use


def test_the_first_pass_of_a_request_is_not_timed_as_a_verification_pass():
    """It also runs the prompt's waiting last chunk, so its time says nothing about the cost of
    verifying its tokens; every later pass is recorded with its size."""

    class Recording(RandomLengthPolicy):
        def __init__(self) -> None:
            super().__init__(seed=5)
            self.recorded = []

        def record_forward(self, num_tokens, seconds, context=0, batch_size=1):
            self.recorded.append(num_tokens)

    lm = pl.from_transformers(tiny_llama(seed=2), TinyTokenizer(32))
    lm.policy = Recording()
    result = lm.generate(list(range(1, 13)) * 4, max_new_tokens=30)
    assert len(lm.policy.recorded) == result.stats.forward_passes - 1 > 0


def test_warm_up_measures_what_the_first_request_would_pay_for():
    lm = pl.from_transformers(tiny_llama(seed=4), TinyTokenizer(32))
    assert not lm.policy.calibrated and not lm.target.kernels.choices
    lm.warm_up()
    assert lm.policy.calibrated
    assert {1, 64, 128} <= set(lm.target.kernels.choices)  # steps, drafts and prompt chunks
    before = dict(lm.target.kernels.choices)
    lm.generate(list(range(1, 13)) * 4, max_new_tokens=16)
    assert lm.target.kernels.choices.keys() == before.keys()  # nothing left to time


def test_a_drafter_that_pays_per_token_drafts_less_the_more_each_token_costs():
    """worth_drafting: argmax_k (1 + E[accepted | k]) / (cost(k + 1) + k * draft cost)."""
    request = Speculation(policy_with_costs({1: 1.0, 64: 1.05}))  # verification nearly free
    rng = random.Random(0)
    for _ in range(400):  # draft-model drafts (no match information): each token 85% accepted
        accepted = next((i for i in range(16) if rng.random() > 0.85), 16)
        request.policy.learn(request.entry(16), accepted)
    lengths = [request.worth_drafting(s, limit=16) for s in (0.0, 0.05, 0.15, 0.3, 5.0)]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] == 16 and 0 < lengths[2] < 16
    assert lengths[-1] == 0  # a draft token dearer than the target's own pass never pays


def test_each_sequence_hands_its_side_of_the_policy_to_draft_models_in_chains():
    from promptlookup.loop import DecodingSequence

    class Paying(pl.NoDrafter):
        policy = None

    paying = Paying()
    chain = pl.ChainDrafter([pl.PromptLookupDrafter(), paying])
    policy = SpeculationPolicy()
    first = DecodingSequence([1, 2], 4, chain, policy=policy)
    assert paying.policy is first.speculation and not hasattr(chain.drafters[0], "policy")
    assert first.speculation.policy is policy
    fixed = DecodingSequence([1, 2], 4, chain)  # speculation="fixed", the same drafter object
    assert paying.policy is fixed.speculation and fixed.speculation.policy is NO_POLICY
    assert NO_POLICY.decide([fixed.speculation.entry(7)]) == [7]  # whole drafts


class InstantTarget:
    """Just enough of a target for calibration: passes take no real work."""

    max_context = 1 << 20

    def __init__(self, cache_length: int) -> None:
        self.cache_length = cache_length
        self.passes = 0

    def forward(self, token_ids):
        self.passes += 1

    def crop(self, length: int) -> None:
        pass

    def prepare(self, sizes) -> None:  # nothing to set up
        pass


def test_context_buckets_double():
    assert [context_bucket(n) for n in (0, 1, 1024, 1025, 2048, 2049, 4096, 8192, 10**6)] == [
        0,
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        5,
    ]


def test_keeps_one_cost_curve_per_context_length(tmp_path):
    """Attention over a long cache makes wide passes dearer, so each context bucket has its own
    measured curve (and cost file); a request uses the one of its prompt's length."""
    store = CostStore(tmp_path / "costs.json")
    store.record_calibration(300, time_passes(InstantTarget(300), 1, (1, 2, 4), repeats=1))
    short = store.curve(300)
    long = store.curve(3000)  # a copy of the short curve, refined by its own passes
    for _ in range(3):
        store.record(1, 1.0, context_length=3000)
        store.record(8, 3.0, context_length=3000)
    store.record(1, 1.0, context_length=900)  # back to a short context: the long curve is saved
    assert store.curve(900) is short and long is not short and long.calibrated
    assert sorted(store.curves) == [0, 2]
    assert (tmp_path / "costs.json").is_file() and (tmp_path / "costs-context2.json").is_file()
    reloaded = CostStore(tmp_path / "costs.json")
    # Loaded from its file, not recalibrated: the very timings the first store measured.
    assert list(reloaded.curve(3500).samples[8]) == list(long.samples[8])
    assert reloaded.calibration_plan(3500) == ((), 0)


def test_a_new_context_length_starts_from_the_nearest_curve_without_timing_passes():
    """A request whose context length has no curve yet does not pay for a calibration: its curve
    starts as a copy of the nearest measured one (one sample per size), which its own passes
    then refine. Only a policy with nothing measured times passes, on the request's target."""
    policy = SpeculationPolicy()
    first = InstantTarget(300)
    calibrate(first, policy, probe_token=1)
    assert first.passes > 0  # nothing measured yet: timed here
    long = InstantTarget(5000)
    calibrate(long, policy, probe_token=1)
    assert long.passes == 0 and policy.calibration_plan(5000) == ((), 0)
    store = policy._costs
    short, copy = store.curve(300), store.curve(5000)
    assert copy is not short and context_bucket(5000) == 3
    assert [list(samples) for _, samples in sorted(copy.samples.items())] == [
        [relative] for _, relative in short.curve()
    ]
    for _ in range(4):  # its own passes (8 tokens dearer here) soon outweigh the copy
        policy.record_forward(1, short.cost(1), context=5000)
        policy.record_forward(8, 2.0 * short.cost(8), context=5000)
    assert copy.cost(8) / copy.cost(1) > 1.5 * short.cost(8) / short.cost(1)


def test_each_tenant_drafts_by_its_own_history():
    """One tenant's rejected drafts never make another's shorter: the history that requests
    share is kept per tenant (the cost curves, facts of the machine, are shared)."""
    policy = policy_with_costs({1: 1.0, 2: 1.5, 16: 2.0, 64: 4.0})
    fresh = verified(Speculation(policy, tenant="b"), 16, 8)
    for _ in range(50):  # tenant a's requests: every draft rejected
        request = Speculation(policy, tenant="a")
        policy.learn(request.entry(16, 8), num_accepted=0)
    assert verified(Speculation(policy, tenant="a"), 16, 8) < fresh
    assert verified(Speculation(policy, tenant="b"), 16, 8) == fresh > 0


def test_a_policy_keeps_the_histories_of_as_many_tenants_as_a_server_keeps_indexes():
    """One bound on tenants (:data:`promptlookup.limits.MAX_TENANTS`): beyond it the least
    recently used tenant's history is forgotten, as its cross-request index is."""
    from promptlookup.drafters.shared_lookup import TenantIndexes
    from promptlookup.limits import MAX_TENANTS

    policy = policy_with_costs({1: 1.0, 2: 1.5, 16: 2.0, 64: 4.0})
    indexes = TenantIndexes("per-tenant", max_tokens=100)
    fresh = verified(Speculation(policy, tenant="a"), 16, 8)
    for _ in range(50):  # tenant a's drafts: every one rejected
        policy.learn(Speculation(policy, tenant="a").entry(16, 8), num_accepted=0)
    first = indexes.for_tenant("a")
    for tenant in range(MAX_TENANTS - 1):  # as many others as fit beside a
        policy.learn(Speculation(policy, tenant=tenant).entry(16, 8), num_accepted=0)
        indexes.for_tenant(tenant)
    assert verified(Speculation(policy, tenant="a"), 16, 8) < fresh  # a is still known
    assert indexes.for_tenant("a") is first
    for tenant in range(MAX_TENANTS - 1, 2 * MAX_TENANTS):  # a is now used least recently
        policy.learn(Speculation(policy, tenant=tenant).entry(16, 8), num_accepted=0)
        indexes.for_tenant(tenant)
    assert verified(Speculation(policy, tenant="a"), 16, 8) == fresh  # forgotten by both
    assert indexes.for_tenant("a") is not first


def test_generate_passes_its_tenant_to_the_policy():
    lm = pl.from_transformers(tiny_llama(seed=2), TinyTokenizer(32))
    prompt = list(range(1, 13)) * 4
    plain = lm.generate(prompt, max_new_tokens=24, drafter="none").token_ids
    seen = []
    learn = lm.policy.learn
    lm.policy.learn = lambda draft, accepted: seen.append(draft.tenant) or learn(draft, accepted)
    assert lm.generate(prompt, max_new_tokens=24, tenant="key-1").token_ids == plain
    assert seen and set(seen) == {"key-1"}
    with pytest.raises(pl.InvalidParameterError, match="tenant"):
        lm.generate(prompt, max_new_tokens=4, tenant=7)
