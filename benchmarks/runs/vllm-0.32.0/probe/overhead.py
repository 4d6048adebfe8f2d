"""Spec-decoding overhead with no drafts: vLLM plain against vLLM with a custom proposer that
never drafts (probe_prop.FixedProposer, k = 0), open-ended suite prompts, 8 in flight."""
import os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(mode):
    from vllm import LLM, SamplingParams
    from promptlookup.bench.suite import suite_rows
    from promptlookup.vllm.command import model_folder

    folder, _ = model_folder(None)
    spec = None
    if mode == "none":
        spec = {"method": "custom_class", "model": "probe_prop.FixedProposer", "num_speculative_tokens": 16}
    llm = LLM(folder, dtype="float32", max_model_len=4096, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec, disable_log_stats=True)
    prompts = [r.messages for r in suite_rows(limit=8, tasks=("open_ended",))]
    greedy = SamplingParams(temperature=0, max_tokens=96)
    llm.chat(prompts[:1], SamplingParams(max_tokens=8), use_tqdm=False)
    for rep in range(4):
        t = time.perf_counter()
        outs = llm.chat(prompts, greedy, use_tqdm=False)
        wall = time.perf_counter() - t
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"{mode} open_ended x8 rep {rep}: {tokens / wall:.1f} tokens/s ({tokens} tokens, {wall:.2f} s)", flush=True)


main(sys.argv[1])
