"""What vLLM's speculative path costs by itself, and how much of it is the per-request metrics
flag (`--per-request-spec-decode-metrics summary`, which `promptlookup vllm-serve` adds for the
middleware's prediction counts): plain vLLM, `spec-off` (the bench's never-drafting proposer,
with the flag) and `spec-off-nometrics` (the same without it), interleaved as the bench does.

    .venv-vllm/bin/python benchmarks/runs/vllm-0.32.0-batch/probe/spec-path/spec_path.py OUT.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import vllm_bench  # noqa: E402
import promptlookup.vllm.command as command  # noqa: E402


def main(out):
    vllm_bench.METHODS["spec-off-nometrics"] = vllm_bench.METHODS["spec-off"]
    vllm_bench.METHOD_ENV["spec-off-nometrics"] = vllm_bench.METHOD_ENV["spec-off"]
    args = vllm_bench.argparse.Namespace(
        concurrency=[1, 8], max_model_len=4096, dtype="float32", enforce_eager=True,
        kv_cache_gib=1, start_timeout=1200, rounds=3, prompts=4, max_tokens=96)
    from promptlookup.bench.suite import suite_rows
    model, _ = command.model_folder(None)
    tasks = {"open_ended": [r.messages for r in suite_rows(limit=4, tasks=("open_ended",))]}
    out = Path(out)
    servers = {}
    try:
        for method in ("plain", "spec-off", "spec-off-nometrics"):
            saved = command.SPEC_METRICS
            if method.endswith("nometrics"):
                command.SPEC_METRICS = ()
            log = out.with_name(f"{out.stem}-{method}.log")
            servers[method] = vllm_bench.start_server(model, vllm_bench.METHODS[method], args, log,
                                                      vllm_bench.METHOD_ENV.get(method))
            command.SPEC_METRICS = saved
            vllm_bench.wait_ready(*servers[method], args, log)
            vllm_bench.chat(servers[method][1], [{"role": "user", "content": "Hello"}], 8)
        results = vllm_bench.run_interleaved(servers, list(servers), tasks, args, out)
    finally:
        for process, _ in servers.values():
            process.terminate()
        for process, _ in servers.values():
            process.wait(timeout=60)
    print(vllm_bench.table(results, args.concurrency))


main(sys.argv[1])
