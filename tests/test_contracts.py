"""The loop's whole contract with drafters and targets is in their protocols' signatures."""

from __future__ import annotations

import json

import torch
from conftest import tiny_llama

from promptlookup.backends.base import Target
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.drafters import ChainDrafter, Draft, NoDrafter, PromptLookupDrafter, make_drafter
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.policy import NO_POLICY
from promptlookup.sampling import SamplingParams, TokenChooser

PROMPT = [3, 5, 7, 9, 11, 3, 5, 7, 9, 11, 3, 5]


def generate(drafter, policy=NO_POLICY, chooser=None, max_new_tokens=20):
    stats = GenerationStats()
    target = TorchTarget(tiny_llama(seed=1))
    tokens = list(
        speculative_generate(
            target,
            PROMPT,
            max_new_tokens=max_new_tokens,
            drafter=drafter,
            chooser=chooser,
            stats=stats,
            policy=policy,
        )
    )
    return tokens, stats


class ListDrafter:
    """A drafter of the simplest kind: its proposals are plain lists, and it has no attributes."""

    def propose(self, tokens, max_tokens):
        return list(tokens[-5:])[:max_tokens]

    def update(self, draft, num_accepted):
        pass


def test_a_drafter_returning_a_plain_list_still_drafts():
    plain, _ = generate(NoDrafter())
    drafted, stats = generate(ListDrafter())
    assert drafted == plain and stats.drafted_tokens > 0


def test_the_loop_hands_the_policy_the_draft_with_its_match_length():
    class Recording:
        def __init__(self):
            self.seen = []

        def calibration_plan(self, context):
            return (), 0

        def decide(self, drafts):  # the policy is handed the draft's match length
            self.seen += [draft.match_length for draft in drafts]
            return [draft.length for draft in drafts]

        def record_forward(self, num_tokens, seconds, context):
            pass

        def learn(self, draft, num_accepted):
            pass

    class Reporting(ListDrafter):
        def propose(self, tokens, max_tokens):
            return Draft(super().propose(tokens, max_tokens), match_length=5)

    policy = Recording()
    plain, _ = generate(NoDrafter())
    assert generate(Reporting(), policy=policy)[0] == plain
    assert policy.seen and set(policy.seen) == {5}


def test_a_draft_carries_its_probabilities_through_cuts():
    probs = torch.rand(4, 8)  # (len(draft), vocab)
    draft = Draft([1, 2, 3, 4], draft_probs=probs, match_length=3)
    cut = draft.cut(2)
    assert cut == [1, 2] and torch.equal(cut.draft_probs, probs[:2]) and cut.match_length == 3
    assert draft.cut(9) is draft and Draft.of(draft) is draft and Draft.of(None) == []


def test_prompt_lookup_drafts_carry_their_match_length():
    drafter = PromptLookupDrafter(num_tokens=3)
    draft = drafter.propose([1, 2, 3, 4, 5, 9, 1, 2], max_tokens=10)
    assert draft == [3, 4, 5] and draft.match_length == drafter.index.match().length == 2


def test_a_draft_model_receives_its_sampler_when_built_and_its_policy_from_the_sequence():
    from conftest import TinyTokenizer

    import promptlookup
    from promptlookup.loop import DecodingSequence

    lm = promptlookup.from_transformers(tiny_llama(seed=1), TinyTokenizer(32))
    chooser = TokenChooser.from_params(SamplingParams(temperature=1.0, seed=0))
    drafter = make_drafter(lm, tokenizer=lm.tokenizer, chooser=chooser)
    assert drafter.chooser is chooser and drafter.policy is None
    chain = make_drafter([PromptLookupDrafter(), lm], tokenizer=lm.tokenizer)
    sequence = DecodingSequence([1, 2], 8, chain, chooser, policy=lm.policy)
    speculation = sequence.speculation
    assert isinstance(chain, ChainDrafter) and chain.drafters[1].policy is speculation
    assert speculation.policy is lm.policy and speculation.sampling


def test_every_backend_declares_prepare():
    assert "prepare" in Target.__dict__
    assert isinstance(TorchTarget(tiny_llama(seed=1)), Target)
    from promptlookup.backends.llamacpp.target import LlamaCppTarget

    assert callable(LlamaCppTarget.prepare)


def test_one_table_of_drafter_options_serves_every_front_end():
    from promptlookup.drafters import OPTIONS
    from promptlookup.drafters.options import BENCH_PARAMS, DRAFTER_OPTIONS, LOOKUP_OPTIONS

    # The bench's method parameters, short and long (``promptlookup:k=8,max_match=3``).
    assert BENCH_PARAMS == {
        "k": "num_tokens",
        "min": "min_match",
        "max": "max_match",
        **{name: name for name in ("num_tokens", "min_match", "max_match")},
    }
    assert LOOKUP_OPTIONS == ("num_tokens", "min_match", "max_match")
    assert OPTIONS["prompt-lookup"] == {
        "cross_request",
        "num_tokens",
        "min_match",
        "max_match",
        "reference_ids",
        "reference_text",
    }
    assert OPTIONS["draft-model"] == {"num_tokens", "start_tokens", "confidence_threshold"}
    assert OPTIONS["none"] == set() and len({o.name for o in DRAFTER_OPTIONS}) == len(
        DRAFTER_OPTIONS
    )


def test_every_command_receives_the_drafter_flags_as_one_dict():
    """The flags come from the table: a command sees the ones given, by option name."""
    import click
    from click.testing import CliRunner

    from promptlookup.cli import drafter_options
    from promptlookup.drafters.options import FLAGGED_OPTIONS

    @click.command()
    @drafter_options
    def command(drafter, speculation, drafter_options):
        click.echo(json.dumps([drafter, speculation, drafter_options]))

    runner = CliRunner()
    given = runner.invoke(command, ["--draft-tokens", "8", "--max-match", "3"])
    assert json.loads(given.output) == [
        "prompt-lookup",
        "adaptive",
        {"num_tokens": 8, "max_match": 3},
    ]
    assert json.loads(runner.invoke(command, []).output)[2] == {}
    help_text = runner.invoke(command, ["--help"]).output
    assert all(option.flag in help_text for option in FLAGGED_OPTIONS)
    assert runner.invoke(command, ["--min-match", "0"]).exit_code == 2  # at least 1


def test_sampling_settings_have_one_form():
    params = SamplingParams(temperature=0.7, top_k=5, seed=3)
    assert SamplingParams(**params.as_kwargs()) == params
    assert SamplingParams.keywords() == (
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "seed",
    )


def test_generate_takes_exactly_the_keywords_of_stream():
    import inspect

    from promptlookup.generation import LanguageModel

    generate = inspect.signature(LanguageModel.generate).parameters
    assert list(generate) == list(inspect.signature(LanguageModel.stream).parameters)


def test_default_threads_are_the_cores_this_process_may_run_on(monkeypatch):
    import os

    from promptlookup.machine import default_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert default_threads() == 3
