"""The policy replay script (benchmarks/studies/policy_replay.py) charges what it claims."""

import importlib.util
from pathlib import Path

from promptlookup.drafters.prompt_lookup import PromptLookupDrafter
from promptlookup.policy import NO_POLICY, SpeculationPolicy

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "studies" / "policy_replay.py"
spec = importlib.util.spec_from_file_location("policy_replay", SCRIPT)
policy_replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy_replay)


class LinearCosts:
    """A pass over n tokens costs ``1 + slope * (n - 1)`` seconds."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def cost(self, n: int) -> float:
        return 1.0 + self.slope * (n - 1)


def policy_with(costs: LinearCosts) -> SpeculationPolicy:
    policy = SpeculationPolicy()
    for n in (1, 2, 4, 8, 16, 32, 64):
        policy.record_forward(n, costs.cost(n))
    return policy


def test_replay_accepts_the_true_prefix_of_each_draft_and_charges_each_pass():
    prompt, output = [1, 2, 3, 4, 5, 1, 2], [3, 4, 5, 9, 1, 2]
    # Pass 1: "1 2" drafts 3 4 5, all accepted, plus the bonus 9 (4 tokens: 1.3 s). Pass 2:
    # nothing before "9" to match, a plain step (1 s). Pass 3: no room left, a plain step.
    seconds = policy_replay.replay(
        prompt, output, PromptLookupDrafter(num_tokens=3), NO_POLICY, LinearCosts(0.1)
    )
    assert seconds == 1.3 + 1.0 + 1.0


def test_policy_never_drafts_where_a_pass_costs_as_much_as_its_tokens_apart():
    prompt, output = [1, 2, 3, 4, 5] * 4, [1, 2, 3, 4, 5] * 6
    costs = LinearCosts(1.0)
    seconds = policy_replay.replay(prompt, output, PromptLookupDrafter(), policy_with(costs), costs)
    assert seconds == len(output)  # one plain pass per token
    cheap = LinearCosts(0.01)
    assert (
        policy_replay.replay(prompt, output, PromptLookupDrafter(), policy_with(cheap), cheap)
        < len(output) / 4
    )
