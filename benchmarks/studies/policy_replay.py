"""How fast would each speculation policy decode the same text, with one measured cost curve?

Replays the greedy ``plain`` outputs of a ``promptlookup bench`` run (their token ids when the
run kept them, else the re-tokenised text) through the prompt-lookup drafter and a policy,
exactly as the loop drives them, except that the target is replaced by the truth: a draft's
accepted tokens are its common prefix with the real continuation (what greedy verification
keeps), and each forward pass over ``n`` tokens costs ``cost(n)`` of a saved cost curve (a file
of ``~/.cache/promptlookup/costs``). Prefill is left out (it is the same for every policy).

Noise-free where a bench run is not: every policy decodes identical text, and the only
difference between policies is which draft lengths they verify. It prints, per task, each
policy's speed-up over plain decoding (``len(output) * cost(1)`` over the passes' total cost):
the default adaptive policy and (``--fixed``) every fixed setting of the ``--sweep`` grid.

    python benchmarks/studies/policy_replay.py benchmarks/runs/xeon-float32-greedy-0.7.6 \\
        --costs ~/.cache/promptlookup/costs/SmolLM2-...-bfloat16-cpu-1threads-v0.6.3-....json \\
        --data ../shared/data/code_edit.jsonl --data ../shared/data/summarization.jsonl \\
        --data ../shared/data/qa.jsonl --data ../shared/data/chat.jsonl \\
        --data open_ended.jsonl

(``open_ended.jsonl``: the built-in suite's ``open_ended`` prompts, rows with ``id``, ``task``
and ``messages``; the file such runs read is in commit 0cb8297.)
"""

from __future__ import annotations

import argparse
import collections
import shutil
import tempfile
from pathlib import Path

from promptlookup.bench.methods import SWEEP_K, SWEEP_MIN_MATCH
from promptlookup.cost_model import CostModel
from promptlookup.drafters.base import Draft
from promptlookup.drafters.prompt_lookup import PromptLookupDrafter
from promptlookup.policy import NO_POLICY, Speculation, SpeculationPolicy


def replay(prompt: list[int], output: list[int], drafter, policy, costs: CostModel) -> float:
    """Seconds of forward passes to produce ``output`` after ``prompt`` (``policy``:
    ``NO_POLICY`` verifies whole drafts)."""
    tokens, position, seconds = list(prompt), 0, 0.0
    speculation = Speculation(policy)  # this request's side of the policy
    while position < len(output):
        # Draft, leaving room for the bonus token; the policy keeps what is worth verifying.
        room = len(output) - position - 1
        draft = Draft.of(drafter.propose(tokens, room)).cut(room) if room > 0 else Draft()
        draft = speculation.shape(draft)
        # The pass accepts the draft's true prefix and the bonus token; it costs the curve's.
        truth = output[position:]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == truth[accepted]:
            accepted += 1
        cost = costs.cost(len(draft) + 1)
        seconds += cost
        policy.record_forward(len(draft) + 1, cost)
        speculation.learn(draft, accepted)
        tokens.extend(truth[: accepted + 1])
        position += accepted + 1
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a greedy promptlookup bench output folder")
    parser.add_argument("--costs", type=Path, required=True, help="a saved cost-curve file")
    parser.add_argument("--data", action="append", required=True, help="the run's data files")
    parser.add_argument("--fixed", action="store_true", help="also every fixed --sweep setting")
    args = parser.parse_args()

    from replay_data import plain_outputs  # beside this script

    tokenizer, outputs = plain_outputs(args.run, args.data)
    eos = [tokenizer.eos_token_id]
    costs = CostModel()
    costs.load(args.costs)
    scratch = Path(tempfile.mkdtemp())
    shutil.copy(args.costs, scratch / "costs.json")  # the policy refines a copy of the curve
    policy = SpeculationPolicy(cost_file=scratch / "costs.json")
    variants = {"default (adaptive)": (lambda: PromptLookupDrafter(eos_token_ids=eos), policy)}
    if args.fixed:
        for m in SWEEP_MIN_MATCH:
            for k in SWEEP_K:
                variants[f"k={k},min={m}"] = (
                    lambda k=k, m=m: PromptLookupDrafter(
                        num_tokens=k, min_match=m, eos_token_ids=eos
                    ),
                    NO_POLICY,
                )
    totals = collections.defaultdict(lambda: [0.0, 0.0])  # (task, variant) -> plain s, s
    for task, prompt, output in outputs:
        if not output:
            continue
        for name, (make_drafter, policy) in variants.items():
            seconds = replay(prompt, output, make_drafter(), policy, costs)
            for key in (task, "all"):
                totals[(key, name)][0] += len(output) * costs.cost(1)
                totals[(key, name)][1] += seconds
    print(
        f"Cost curve: {args.costs.name}: "
        + ", ".join(f"{n}: {costs.cost(n) * 1e3:.1f} ms" for n in (1, 2, 4, 8, 16, 32, 64))
    )
    tasks = [t for t in dict.fromkeys(key for key, _ in totals) if t != "all"] + ["all"]
    speedup = {key: plain / seconds for key, (plain, seconds) in totals.items()}
    print("| policy | " + " | ".join(tasks) + " |")
    print("|---|" + "---:|" * len(tasks))
    for name in variants:
        print(f"| {name} | " + " | ".join(f"{speedup[(t, name)]:.3f}" for t in tasks) + " |")
    fixed = [name for name in variants if name.startswith("k=")]
    if fixed:
        best = {t: max(fixed, key=lambda name: speedup[(t, name)]) for t in tasks}
        print("| best fixed | " + " | ".join(f"{best[t]}" for t in tasks) + " |")
        print(
            "| default / best fixed | "
            + " | ".join(
                f"{speedup[(t, 'default (adaptive)')] / speedup[(t, best[t])]:.3f}" for t in tasks
            )
            + " |"
        )


if __name__ == "__main__":
    main()
