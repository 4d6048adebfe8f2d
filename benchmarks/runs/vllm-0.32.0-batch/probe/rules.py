"""promptlookup's proposer in one vLLM engine (in process), 8 requests in flight, the batch
rule switched between runs: ``none`` (a proposer that never drafts), ``throughput`` (the
policy's own rule, as before), ``bottleneck`` (the new rule), each optionally with the plain
answer as a prediction (``+pred``). Interleaved: every round runs every mode once per task.

    LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python \\
        benchmarks/runs/vllm-0.32.0-batch/probe/rules.py TASKS MODES ROUNDS [NUM_SPEC]
"""
import json, os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from promptlookup.vllm.proposer import PromptLookupProposer

MODE = {"m": "throughput"}
LOG = []


class SwitchProposer(PromptLookupProposer):
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        mode = MODE["m"].split("+")[0]
        self.scale = mode.startswith("scaled")
        self.others = 0.25 if mode.endswith("-q") else 0.0
        self.batch_rule = "throughput" if mode in ("none", "throughput", "fixed") else "bottleneck"
        self.adaptive = mode != "fixed"
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        if mode == "none":
            for s in self.table.rows:
                if s is not None:
                    s.last_draft = []
            drafts = [[] for _ in drafts]
        LOG.append((sum(1 for s in sampled_token_ids if s), sum(len(d) for d in drafts),
                    sum(max(0, len(s) - 1) for s in sampled_token_ids)))
        return drafts


def main(tasks, modes, rounds, num_spec):
    from vllm import LLM, SamplingParams
    from promptlookup.bench.suite import suite_rows
    from promptlookup.vllm.command import model_folder

    folder, _ = model_folder(None)
    spec = {"method": "custom_class", "model": "rules.SwitchProposer", "num_speculative_tokens": num_spec}
    llm = LLM(folder, dtype="float32", max_model_len=4096, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec, disable_log_stats=True)
    llm.chat([[{"role": "user", "content": "Hello"}]], SamplingParams(max_tokens=8), use_tqdm=False)
    results = {}
    for task in tasks:
        prompts = [r.messages for r in suite_rows(limit=8, tasks=(task,))]
        MODE["m"] = "none"
        ref = [o.outputs[0].text for o in llm.chat(prompts, SamplingParams(temperature=0, max_tokens=96), use_tqdm=False)]
        for rnd in range(rounds):
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            for mode in order:
                MODE["m"] = mode
                if mode.endswith("+pred"):
                    params = [SamplingParams(temperature=0, max_tokens=96, extra_args={"prediction": t}) for t in ref]
                else:
                    params = SamplingParams(temperature=0, max_tokens=96)
                LOG.clear()
                t = time.perf_counter()
                outs = llm.chat(prompts, params, use_tqdm=False)
                wall = time.perf_counter() - t
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                same = sum(o.outputs[0].text == r for o, r in zip(outs, ref))
                drafted = sum(d for _, d, _ in LOG); accepted = sum(a for *_, a in LOG)
                cell = results.setdefault(task, {}).setdefault(mode, {"tokens": 0, "seconds": 0.0, "steps": [], "same": []})
                cell["tokens"] += tokens; cell["seconds"] += wall; cell["steps"].append(len(LOG)); cell["same"].append(same)
                print(f"{task} {mode} round {rnd + 1}: {tokens / wall:.1f} tokens/s ({tokens} tokens, {wall:.2f} s), {len(LOG)} steps, drafted {drafted}, accepted {accepted}, same {same}/8", flush=True)
        base = results[task].get("none")
        for mode, cell in results[task].items():
            tps = cell["tokens"] / cell["seconds"]
            print(f"== {task} {mode}: {tps:.1f} tokens/s" + (f", {tps / (base['tokens'] / base['seconds']):.2f}x none" if base else ""), flush=True)
    print(json.dumps(results))


main(sys.argv[1].split(","), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 16)
