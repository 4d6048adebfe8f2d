"""The bottleneck rule of promptlookup's vLLM proposer (``promptlookup.vllm.batch_policy``):
in a pass over several requests, drafts only for the requests that set the batch's length
(and for those with a prediction). Offline: no vLLM, a fake runner and a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from promptlookup.policy import AcceptanceModel, SequenceDraft, SpeculationPolicy, match_bucket
from promptlookup.vllm import PromptLookupProposer
from promptlookup.vllm.batch_policy import (
    RowPace,
    bottleneck_weights,
    one_cohort,
    projected_steps,
)
from promptlookup.vllm.proposer import PRIOR_SHAPE

MAX_LEN = 512


def policy_with_costs(per_token_ms: float = 1.0, step_ms: float = 25.0) -> SpeculationPolicy:
    """A policy whose passes over 2 rows cost ``step_ms`` plus ``per_token_ms`` per token."""
    policy = SpeculationPolicy()
    policy.record_calibration(  # as the proposer starts it
        0, [(size, relative * 0.01, 0.01) for size, relative in PRIOR_SHAPE.items()]
    )
    for _ in range(8):
        for tokens in (2, 3, 4, 6, 10, 18, 34, 66):
            policy.record_forward(tokens, (step_ms + per_token_ms * tokens) / 1e3, batch_size=2)
    return policy


def entry(length: int, match_length: int) -> SequenceDraft:
    return SequenceDraft(length, match_length, AcceptanceModel(), False)


def test_bottleneck_rule_projects_steps_from_the_pace_so_far():
    assert projected_steps(RowPace(remaining=90, produced=29, steps=9)) == 30.0
    assert projected_steps(RowPace(remaining=50)) == 50.0  # not decoded yet: a token a step
    assert projected_steps(RowPace(remaining=0, produced=5, steps=2)) == 0.0


def test_bottleneck_rule_weighs_only_the_rows_that_set_the_batchs_length():
    behind = RowPace(remaining=80, produced=10, steps=10)  # 80 steps to go
    tied = RowPace(remaining=79, produced=10, steps=10)  # within the slack
    ahead = RowPace(remaining=40, produced=30, steps=10)  # about 14 steps to go
    predicted = RowPace(remaining=40, produced=30, steps=10, predicted=True)
    assert bottleneck_weights([behind, tied, ahead, predicted]) == [1.0, 1.0, 0.0, 1.0]
    assert bottleneck_weights([behind, ahead], others=0.25) == [1.0, 0.25]


def test_bottleneck_rule_is_the_policys_own_rule_alone_or_when_limits_are_unknown():
    assert bottleneck_weights([RowPace(remaining=5)]) == [1.0]
    unknown = [RowPace(remaining=80), RowPace(remaining=None)]
    assert bottleneck_weights(unknown) == [1.0, 1.0]
    policy = policy_with_costs()
    drafts = [entry(8, 12), entry(8, 2)]
    own = policy.decide(drafts)
    assert policy.decide(drafts, weights=[1.0, 1.0]) == own


def test_bottleneck_rule_gives_rows_ahead_no_draft_and_keeps_the_bottlenecks():
    policy = policy_with_costs()
    drafts = [entry(8, 12), entry(8, 12)]  # long trusted matches: both draft under the policy
    assert all(policy.decide(drafts))
    lengths = policy.decide(drafts, weights=[1.0, 0.0])
    assert lengths[0] > 0 and lengths[1] == 0


def test_bottleneck_rule_drafts_nothing_when_the_bottleneck_cannot_be_sped_up():
    """The row behind drafts on one-token matches that it has seen rejected; the row ahead on
    a trusted one: the batch's length is the first row's, so no row drafts."""
    policy = policy_with_costs(per_token_ms=3.0)
    weak = entry(8, 1)
    for _ in range(20):
        weak.acceptance.record(match_bucket(1), 8, 0)
    drafts = [weak, entry(8, 12)]
    assert policy.decide(drafts, weights=[1.0, 0.0]) == [0, 0]


class FakeRunner:
    """vLLM's model runner as the proposer reads it: the rows' request ids and, per request,
    its prompt length and sampling parameters."""

    def __init__(self) -> None:
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests: dict[str, SimpleNamespace] = {}

    def add(self, req_id: str, prompt: int, max_tokens: int, prediction=None) -> None:
        params = SimpleNamespace(
            max_tokens=max_tokens,
            temperature=0.0,
            extra_args={"prediction": prediction} if prediction else None,
        )
        self.requests[req_id] = SimpleNamespace(num_prompt_tokens=prompt, sampling_params=params)


def proposer_for(runner: FakeRunner, batch_rule: str | None = None) -> PromptLookupProposer:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=8),
        model_config=SimpleNamespace(
            max_model_len=MAX_LEN, hf_text_config=SimpleNamespace(eos_token_id=0)
        ),
    )
    proposer = PromptLookupProposer(config, batch_rule=batch_rule)
    proposer._runner = runner
    return proposer


def step(proposer, runner, requests: dict[str, list[int]], sampled: dict[str, list[int]]):
    ids = list(requests)
    runner.input_batch.req_ids = ids
    rows = np.zeros((len(ids), MAX_LEN), dtype=np.int32)
    for i, req_id in enumerate(ids):
        rows[i, : len(requests[req_id])] = requests[req_id]
    lengths = np.array([len(requests[r]) for r in ids], dtype=np.int32)
    drafts = proposer.propose([sampled[r] for r in ids], lengths, rows)
    return dict(zip(ids, drafts))


def run_two(batch_rule: str | None, proposer=None, runner=None, ahead_joins_at: int = 0):
    """Two requests repeating a pattern (every draft would be accepted), one 60 tokens ahead
    of the other under the same limit: the drafts of the last of several steps. The "ahead"
    request joins the batch at step ``ahead_joins_at`` (the other at step 0)."""
    runner = runner or FakeRunner()
    pattern = [5, 6, 7, 8, 9, 10, 11, 12]
    prompt = pattern * 4
    runner.add("behind", len(prompt), 96)
    runner.add("ahead", len(prompt), 96)
    proposer = proposer or proposer_for(runner, batch_rule)
    if ahead_joins_at:
        proposer.steps = 0
        step(proposer, runner, {"behind": prompt + pattern[:1]}, {"behind": []})
        proposer.steps = ahead_joins_at
    for _ in range(4):  # the policy learns that drafts are accepted, passes cost 1 ms a token
        proposer.policy.record_forward(10, 0.035, batch_size=2)
        proposer.policy.record_forward(2, 0.027, batch_size=2)
    behind = prompt + pattern[:1]
    ahead = prompt + (pattern * 8)[:61]
    drafts = step(proposer, runner, {"behind": behind, "ahead": ahead}, {"behind": [], "ahead": []})
    for _ in range(3):
        sampled = {}
        for req_id, tokens in (("behind", behind), ("ahead", ahead)):
            draft = drafts[req_id]
            sampled[req_id] = [*draft, (pattern * 20)[len(tokens) - len(prompt) + len(draft)]]
        behind = behind + sampled["behind"]
        ahead = ahead + sampled["ahead"]
        drafts = step(proposer, runner, {"behind": behind, "ahead": ahead}, sampled)
    return drafts


def test_bottleneck_rule_in_the_proposer_drafts_for_the_request_behind_only():
    drafts = run_two(None)  # the default rule
    assert drafts["behind"] and not drafts["ahead"]


def test_throughput_rule_in_the_proposer_drafts_for_both():
    drafts = run_two("throughput")
    assert drafts["behind"] and drafts["ahead"]


def test_bottleneck_rule_keeps_drafting_for_a_request_with_a_prediction():
    runner = FakeRunner()
    prompt = [3, 4, 5, 6]
    answer = list(range(20, 60))
    runner.add("plain", len(prompt), 96)
    runner.add("predicted", len(prompt), 96, prediction=answer)
    proposer = proposer_for(runner)
    requests = {"plain": prompt + [1], "predicted": prompt + answer[:30]}
    drafts = step(proposer, runner, requests, {"plain": [], "predicted": []})
    sampled = {"plain": [2], "predicted": [answer[30]]}
    requests = {"plain": prompt + [1, 2], "predicted": prompt + answer[:31]}
    drafts = step(proposer, runner, requests, sampled)
    assert drafts["predicted"][:3] == answer[31:34]


def test_an_unknown_batch_rule_is_refused():
    with pytest.raises(ValueError):
        proposer_for(FakeRunner(), "fastest")


def test_bottleneck_rule_applies_to_one_cohort_only():
    assert one_cohort([10, 10, 12, 17])
    assert not one_cohort([10, 10, 12, 40])  # a request joined later: freed slots are refilled
    assert not one_cohort([])


def test_bottleneck_rule_gives_way_to_the_throughput_rule_when_a_request_joins_later():
    runner = FakeRunner()
    proposer = proposer_for(runner)
    drafts = run_two(None, proposer=proposer, runner=runner, ahead_joins_at=100)
    assert drafts["behind"] and drafts["ahead"]
