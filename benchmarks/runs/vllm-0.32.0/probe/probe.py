import os, sys, json, time, statistics
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, os.path.dirname(__file__))
import probe_prop

def prompts(path, n):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r["messages"] for r in rows[:n]]

def main(mode, out):
    from vllm import LLM, SamplingParams
    from promptlookup.vllm.command import model_folder
    folder, _ = model_folder(None)
    spec = None
    if mode == "fixed":
        spec = {"method": "custom_class", "model": "probe_prop.FixedProposer", "num_speculative_tokens": 16}
    elif mode == "timed":
        spec = {"method": "custom_class", "model": "probe_prop.TimedProposer", "num_speculative_tokens": 16}
    elif mode == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    llm = LLM(folder, dtype="float32", max_model_len=4096, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec, disable_log_stats=True)
    greedy = SamplingParams(temperature=0, max_tokens=int(os.environ.get("MAXTOK", "64")), ignore_eos=mode=="fixed")
    result = {}
    oe = prompts("/work/main/benchmarks/data/open_ended.jsonl", 8)
    tasks = {"code_edit": prompts("/work/shared/data/code_edit.jsonl", 8),
             "summarization": prompts("/work/shared/data/summarization.jsonl", 8),
             "open_ended": oe}
    llm.chat([[{"role": "user", "content": "Hello"}]], SamplingParams(max_tokens=8))
    if mode == "fixed":
        src = tasks[os.environ.get("TASK", "open_ended")]
        oe = src
        for batch in (1, 8):
            for k in (0, 1, 2, 4, 0, 1, 2, 4, 8, 0):
                probe_prop.K["k"] = k
                probe_prop.LOG.clear()
                t = time.perf_counter()
                llm.chat(oe[:batch], greedy, use_tqdm=False)
                wall = time.perf_counter() - t
                log = probe_prop.LOG
                gaps = [b[0] - a[0] for a, b in zip(log, log[1:]) if a[2] == batch and b[2] == batch and a[1] == batch]
                med = statistics.median(gaps) if gaps else None
                allg = [b[0] - a[0] for a, b in zip(log, log[1:])]
                print(f"batch {batch} k {k}: step median {med*1e3:.1f} ms over {len(gaps)} steps, all {len(allg)} calls sum {sum(allg):.2f}s max {max(allg)*1e3:.0f}ms, wall {wall:.2f}s first-call {log[0][0]-t:.2f}s", flush=True)
                result[f"{batch}-{k}"] = {"median_ms": med*1e3, "steps": len(gaps), "wall": wall}
    else:
        for task, ps in tasks.items():
            for batch in (1, 8):
                probe_prop.LOG.clear()
                t = time.perf_counter()
                if batch == 1:
                    outs = [llm.chat([p], greedy, use_tqdm=False)[0] for p in ps]
                else:
                    outs = llm.chat(ps, greedy, use_tqdm=False)
                wall = time.perf_counter() - t
                toks = sum(len(o.outputs[0].token_ids) for o in outs)
                entry = {"wall": wall, "tokens": toks, "tps": toks / wall}
                if mode == "timed" and probe_prop.LOG:
                    log = probe_prop.LOG
                    entry["propose_ms_mean"] = 1e3 * statistics.mean(b - a for a, b, *_ in log)
                    entry["propose_ms_max"] = 1e3 * max(b - a for a, b, *_ in log)
                    entry["calls"] = len(log)
                    drafted = [sum(d) for *_, d in log]
                    entry["drafted_tokens"] = sum(drafted)
                    entry["steps_with_draft"] = sum(1 for d in drafted if d)
                    # accepted: sum over next call of len(sampled)-1
                    entry["accepted_est"] = sum(max(0, n - 1) for _, _, s, _ in log for n in s)
                    gaps = [(log[i+1][0] - log[i][1], sum(log[i][3])) for i in range(len(log)-1)]
                    by = {}
                    for g, d in gaps:
                        by.setdefault(min(d, 64), []).append(g)
                    entry["step_ms_by_drafted"] = {k: (round(1e3*statistics.median(v),1), len(v)) for k, v in sorted(by.items())}
                print(mode, task, batch, json.dumps(entry), flush=True)
                result[f"{task}-{batch}"] = entry
        if mode == "timed":
            from promptlookup.vllm.proposer import INSTANCES
            p = list(INSTANCES)[0]
            for b, curve in [(1, p.policy.costs)] + sorted(p.policy.batch_curves.items()):
                print("curve", b, {n: round(curve.cost(n)*1e3,1) for n in (1,2,4,8,9,16,17,24,32,64,128)})
    json.dump(result, open(out, "w"), indent=1)

main(sys.argv[1], sys.argv[2])
