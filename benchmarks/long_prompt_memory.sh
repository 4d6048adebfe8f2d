#!/bin/bash
# One long prompt, as an agent's first request: peak resident memory (VmHWM) of
# `promptlookup serve` (its defaults: the prefix cache with its disk tier, in a fresh folder)
# and of llama-server (its defaults) answering the same TOKENS-token prompt, the token ids of
# the standard library's Python sources in the model's tokenizer, through /v1/completions,
# greedy, MAX_TOKENS new tokens, THREADS threads each. The servers run one after the other
# (each alone on the cores); each server's memory is read from /proc/PID/status when it
# answers /health (idle) and after its answer. Output in OUT: report.md, memory.json and both
# answers (whether their texts are the same is said; llama.cpp's arithmetic is not ours, so
# greedy texts may part after many tokens).
#   MODEL=gemma-3-270m TOKENS=24000 OUT=benchmarks/runs/NAME bash benchmarks/long_prompt_memory.sh
# MODEL: a name `promptlookup serve --model` takes (default gemma-3-270m); LLAMA_SERVER: the
# binary; LLAMA_ARGS: extra llama-server flags; PY: the Python with promptlookup installed.
# About 4 minutes for 24,000 tokens of Gemma 3 270M on 2 quiet cores.
set -euo pipefail
PY=${PY:-python}
MODEL=${MODEL:-gemma-3-270m}
TOKENS=${TOKENS:-24000}
MAX_TOKENS=${MAX_TOKENS:-16}
THREADS=${THREADS:-2}
PORT=${PORT:-18311}  # llama-server's; serve's the next one
LLAMA=${LLAMA_SERVER:-/work/llama-build/build/bin/llama-server}
OUT=${OUT:-long-prompt-memory}
mkdir -p "$OUT"
GGUF=$($PY -c "from promptlookup.models import resolve_model as r; s=r('$MODEL'); print(s.location + '/' + s.gguf_file)")
# The prompt: TOKENS token ids of argparse.py and the other standard-library sources.
$PY - "$MODEL" "$TOKENS" "$MAX_TOKENS" >"$OUT/request.json" <<'EOF'
import json, sys, sysconfig
from pathlib import Path
from promptlookup.loading import gguf_tokenizer
model, tokens, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokenizer = gguf_tokenizer(model)
folder, ids = Path(sysconfig.get_paths()["stdlib"]), []
for path in [folder / "argparse.py", *sorted(folder.glob("*.py"))]:
    ids += tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"]
    if len(ids) >= tokens:
        break
print(json.dumps({"model": model, "prompt": ids[:tokens], "max_tokens": new, "temperature": 0}))
EOF
memory() {  # "VmRSS VmHWM" of process $1, in KiB
  awk '/^VmRSS|^VmHWM/ {v[$1] = $2} END {print v["VmRSS:"], v["VmHWM:"]}' "/proc/$1/status"
}
run() {  # NAME PORT COMMAND...: start, wait for /health, read idle memory, ask, read memory
  local name=$1 port=$2
  shift 2
  if curl -s "localhost:$port" >/dev/null; then
    echo "port $port is taken: set PORT" >&2
    exit 1
  fi
  "$@" >"$OUT/$name.log" 2>&1 &
  local pid=$!
  until curl -sf "localhost:$port/health" >/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "$name ended: see $OUT/$name.log" >&2; exit 1; }
    sleep 1
  done
  local idle start end
  idle=$(memory $pid)
  # The request, to the model id the server says it has.
  curl -sf "localhost:$port/v1/models" | $PY -c 'import json, sys
request = json.load(open(sys.argv[1])); request["model"] = json.load(sys.stdin)["data"][0]["id"]
print(json.dumps(request))' "$OUT/request.json" >"$OUT/$name-request.json"
  start=$(date +%s.%N)
  curl -sf "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
    -d @"$OUT/$name-request.json" >"$OUT/$name-answer.json"
  rm "$OUT/$name-request.json"
  end=$(date +%s.%N)
  echo "$name $idle $(memory $pid) $(echo "$end - $start" | bc)"
  kill $pid
  wait $pid 2>/dev/null || true
}
BLOCKS=$(mktemp -d)
trap 'rm -rf "$BLOCKS"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# shellcheck disable=SC2086
LLAMA_ROW=$(run llama-server $PORT "$LLAMA" -m "$GGUF" -t "$THREADS" ${LLAMA_ARGS:-} --port $PORT)
SERVE_ROW=$(run promptlookup $((PORT + 1)) $PY -m promptlookup serve --model "$MODEL" --port $((PORT + 1)) \
  --threads "$THREADS" --prefix-cache-dir "$BLOCKS/prefix-cache")
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
$PY - "$OUT" "$TOKENS" "$LOAD_BEFORE" "$LOAD_AFTER" "$LLAMA_ROW" "$SERVE_ROW" <<'EOF'
import json, sys
out, tokens, before, after, *rows = sys.argv[1:]
servers = {}
for row in rows:
    name, idle_rss, idle_hwm, rss, hwm, seconds = row.split()
    answer = json.load(open(f"{out}/{name}-answer.json"))
    servers[name] = {
        "idle_rss_mib": round(int(idle_rss) / 1024), "peak_mib": round(int(hwm) / 1024),
        "rss_after_mib": round(int(rss) / 1024), "seconds": round(float(seconds), 1),
        "prompt_tokens": answer["usage"]["prompt_tokens"], "text": answer["choices"][0]["text"],
    }
ours, theirs = servers["promptlookup"], servers["llama-server"]
json.dump({"tokens": int(tokens), "load": [before, after], "servers": servers},
          open(f"{out}/memory.json", "w"), indent=1)
lines = [f"One {tokens}-token prompt, load average {before} before, {after} after.", "",
         "| server | prompt tokens | idle | peak (VmHWM) | after | seconds |",
         "|---|---:|---:|---:|---:|---:|"]
for name, s in servers.items():
    lines.append(f"| {name} | {s['prompt_tokens']} | {s['idle_rss_mib']} MiB | **{s['peak_mib']} MiB** "
                 f"| {s['rss_after_mib']} MiB | {s['seconds']} |")
lines += ["", f"Peak: {ours['peak_mib'] / theirs['peak_mib']:.2f}x llama-server's; "
          f"texts {'the same' if ours['text'] == theirs['text'] else 'not the same'}."]
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
