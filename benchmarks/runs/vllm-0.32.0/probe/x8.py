"""promptlookup's proposer with 8 open-ended requests in flight, repeated: what it drafts, what
its steps cost by draft tokens, and the policy's cost curve for 8 sequences."""
import os, statistics, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_prop


def main(task):
    from vllm import LLM, SamplingParams
    from promptlookup.bench.suite import suite_rows
    from promptlookup.vllm.command import model_folder
    from promptlookup.vllm.proposer import INSTANCES

    folder, _ = model_folder(None)
    spec = {"method": "custom_class", "model": "probe_prop.TimedProposer", "num_speculative_tokens": 16}
    llm = LLM(folder, dtype="float32", max_model_len=4096, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec, disable_log_stats=True)
    prompts = [r.messages for r in suite_rows(limit=8, tasks=(task,))]
    greedy = SamplingParams(temperature=0, max_tokens=96)
    llm.chat(prompts[:1], SamplingParams(max_tokens=8), use_tqdm=False)
    for rep in range(int(os.environ.get("REPS", "4"))):
        probe_prop.LOG.clear()
        t = time.perf_counter()
        outs = llm.chat(prompts, greedy, use_tqdm=False)
        wall = time.perf_counter() - t
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        log = probe_prop.LOG
        by = {}
        for a, b in zip(log, log[1:]):
            if len(a[2]) == 8 and all(a[2]) and all(b[2]):
                by.setdefault(sum(a[3]), []).append(b[0] - a[1])
        drafted = sum(sum(d) for *_, d in log)
        accepted = sum(max(0, n - 1) for _, _, s, _ in log for n in s)
        steps = {k: (round(1e3 * statistics.median(v), 1), len(v)) for k, v in sorted(by.items())}
        print(f"{task} x8 rep {rep}: {tokens / wall:.1f} tokens/s, {len(log)} steps, drafted {drafted}, accepted {accepted}; batch-8 steps ms by drafted: {steps}", flush=True)
    p = list(INSTANCES)[0]
    curve = p.policy.batch_costs(8)
    print("policy curve batch 8 (ms):", {n: round(curve.cost(n) * 1e3, 1) for n in (8, 9, 10, 12, 16, 24, 32, 48, 64)})


main(sys.argv[1] if len(sys.argv) > 1 else "open_ended")
