import os, sys, json, time, statistics
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, os.path.dirname(__file__))
import switch_prop

def prompts(path, n):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r["messages"] for r in rows[:n]]

def main(modes, out, rounds=2, n=8, tasks_sel="code_edit,summarization,open_ended", levels=(1, 8)):
    from vllm import LLM, SamplingParams
    from promptlookup.vllm.command import model_folder
    folder, _ = model_folder(None)
    spec = {"method": "custom_class", "model": "switch_prop.Switch", "num_speculative_tokens": int(os.environ.get("NSPEC", "16"))}
    llm = LLM(folder, dtype="float32", max_model_len=4096, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec, disable_log_stats=True)
    greedy = SamplingParams(temperature=0, max_tokens=int(os.environ.get("MAXTOK", "96")))
    alltasks = {"code_edit": prompts("/work/shared/data/code_edit.jsonl", n),
             "summarization": prompts("/work/shared/data/summarization.jsonl", n),
             "open_ended": prompts("/work/main/benchmarks/data/open_ended.jsonl", n)}
    tasks = {t: alltasks[t] for t in tasks_sel.split(",")}
    llm.chat([[{"role": "user", "content": "Hello"}]], SamplingParams(max_tokens=8))
    res = {}
    for r in range(rounds):
        for task, ps in tasks.items():
            for batch in levels:
                groups = [[p] for p in ps] if batch == 1 else [ps]
                acc = {m: [0.0, [], []] for m in modes}
                for gi, g in enumerate(groups):
                    order = modes[gi % len(modes):] + modes[:gi % len(modes)]
                    for m in order:
                        switch_prop.MODE["m"] = m
                        switch_prop.LOG.clear()
                        t = time.perf_counter()
                        o = llm.chat(g, greedy, use_tqdm=False)
                        acc[m][0] += time.perf_counter() - t
                        acc[m][1] += o
                        acc[m][2] += list(switch_prop.LOG)
                for m in modes:
                    wall, outs, log = acc[m]
                    toks = sum(len(o.outputs[0].token_ids) for o in outs)
                    e = res.setdefault(f"{task}|{batch}|{m}", {"wall": 0, "tokens": 0, "calls": 0, "drafted": 0, "accepted": 0, "propose_s": 0.0, "texts": None})
                    e["wall"] += wall; e["tokens"] += toks; e["calls"] += len(log)
                    e["drafted"] += sum(sum(d) for *_, d in log)
                    e["accepted"] += sum(max(0, x - 1) for _, _, s, _ in log for x in s)
                    e["propose_s"] += sum(b - a for a, b, *_ in log)
                    texts = [list(o.outputs[0].token_ids) for o in outs]
                    if e["texts"] is None: e["texts"] = texts
                    print(f"r{r} {task} x{batch} {m}: {toks/wall:.1f} tok/s calls {len(log)} drafted {sum(sum(d) for *_, d in log)} accepted {sum(max(0, x - 1) for _, _, s, _ in log for x in s)}", flush=True)
    print("SUMMARY")
    for task in tasks:
        for batch in levels:
            base = {m: res[f"{task}|{batch}|{m}"] for m in modes}
            ref = base[modes[0]]["tokens"] / base[modes[0]]["wall"]
            ng = base.get("ngram")
            for m in modes:
                e = base[m]; tps = e["tokens"] / e["wall"]
                same = sum(a == b for a, b in zip(e["texts"], base[modes[0]]["texts"]))
                extra = f" x ngram {tps / (ng['tokens']/ng['wall']):.2f}" if ng else ""
                print(f"{task} x{batch} {m}: {tps:.1f} tok/s, x {modes[0]} {tps/ref:.2f}{extra}, steps {e['calls']}, drafted {e['drafted']}, accepted {e['accepted']}, propose {1e3*e['propose_s']/max(1,e['calls']):.2f} ms/call, same {same}/{len(e['texts'])}")
    for e in res.values(): e.pop("texts")
    json.dump(res, open(out, "w"), indent=1)

main(sys.argv[1].split(","), sys.argv[2], rounds=int(os.environ.get("ROUNDS", "2")), n=int(os.environ.get("N", "8")),
     tasks_sel=os.environ.get("TASKS", "code_edit,summarization,open_ended"))
