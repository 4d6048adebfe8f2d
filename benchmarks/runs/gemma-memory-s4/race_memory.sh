#!/usr/bin/env bash
# The Gemma race's 12 requests (gemma_race.sh's prompts, 128 tokens, greedy), sent one by one
# to promptlookup serve (this tree, defaults) and to llama-server (defaults), 2 s apart; each
# server's lifetime peak resident memory (VmHWM) after its start-up and after the requests.
set -euo pipefail
OUT=$1; PY=/work/main/.venv/bin/python; LLAMA=/work/llama-build/build/bin/llama-server
mkdir -p "$OUT"
GGUF=$($PY -c "from promptlookup.models import packaged_gguf_path; print(packaged_gguf_path('gemma-3-270m'))")
JOIN='{% for m in messages %}{{ m.content }}{% if not loop.last %}

{% endif %}{% endfor %}'
$PY - "$OUT/bodies.jsonl" <<'PY'
import json, sys
from promptlookup.bench.open_ended import OPEN_ENDED
out = open(sys.argv[1], "w")
for name in ("code_edit", "summarization"):
    for line in list(open(f"/work/shared/data/{name}.jsonl"))[:4]:
        r = json.loads(line)
        out.write(json.dumps({"model": "m", "messages": r["messages"], "max_tokens": 128, "temperature": 0}) + "\n")
for p in OPEN_ENDED[:4]:
    out.write(json.dumps({"model": "m", "messages": [{"role": "user", "content": p}], "max_tokens": 128, "temperature": 0}) + "\n")
PY
hwm() { grep VmHWM /proc/$1/status | awk '{print $2/1024}'; }
run() {  # name port pid
  until curl -sf "http://127.0.0.1:$2/v1/models" >/dev/null; do sleep 0.5; done
  echo "$1 ready: VmHWM $(hwm $3) MiB, VmRSS $(grep VmRSS /proc/$3/status | awk '{print $2/1024}') MiB" | tee -a "$OUT/memory.txt"
  echo 5 >/proc/$3/clear_refs  # the peak from here on: the requests' (as the bench resets it)
  i=0
  model=$(curl -s "http://127.0.0.1:$2/v1/models" | $PY -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
  while read -r body; do
    i=$((i+1))
    curl -sf "http://127.0.0.1:$2/v1/chat/completions" -H 'Content-Type: application/json' -d "${body/\"model\": \"m\"/\"model\": \"$model\"}" >"$OUT/$1-$i.json"
    echo "$1 request $i: VmHWM $(hwm $3) MiB" | tee -a "$OUT/memory.txt"
    sleep 2
  done <"$OUT/bodies.jsonl"
}
PYTHONPATH=$PWD/src nice -n 5 $PY -m promptlookup serve --model gemma-3-270m --port 8190 --threads 2 >"$OUT/serve.log" 2>&1 &
SP=$!
run promptlookup-serve 8190 $SP
kill $SP; wait $SP || true
nice -n 5 "$LLAMA" -m "$GGUF" --port 8189 -t 2 -c 8192 --jinja --chat-template "$JOIN" >"$OUT/llama-server.log" 2>&1 &
LP=$!
run llama-server 8189 $LP
kill $LP; wait $LP || true
