#!/usr/bin/env bash
# Gemma 3 270M: `promptlookup serve` against llama-server on the same GGUF, through the OpenAI
# API, one interleaved bench run (code edits, summaries, open-ended), 2 threads each, greedy.
# Usage: benchmarks/gemma_race.sh OUT_DIR [LIMIT] [LLAMA_SERVER]
# Both servers see the same prompt text: Gemma 3 270M (base) has no chat template, so
# promptlookup joins the messages' contents with blank lines, and llama-server is given that
# join as its template. Start-up: seconds from launch to the first answer of /v1/models, for
# promptlookup serve's second start (its caches made by the first). llama-server runs with
# --no-repack unless LLAMA_ARGS says otherwise: a -DGGML_NATIVE=ON build's AMX-repacked weights crash
# on this project's machines (SIGSEGV); with a NATIVE=OFF build, LLAMA_ARGS= runs its defaults.
set -euo pipefail
OUT=${1:?output folder}
LIMIT=${2:-4}
LLAMA=${3:-/work/llamacpp/build/bin/llama-server}
PY=${PY:-python}
GGUF=$($PY -c "from promptlookup.models import packaged_gguf_path; print(packaged_gguf_path('gemma-3-270m'))")
DATA=${DATA:-/work/shared/data}
JOIN='{% for m in messages %}{{ m.content }}{% if not loop.last %}

{% endif %}{% endfor %}'
mkdir -p "$OUT"
# serve's default disk tier (--prefix-cache-dir auto) in a fresh folder: the user's may hold an
# earlier run's prompts. Removed at the end.
BLOCKS=$(mktemp -d)
# The open-ended prompts (the built-in suite's, bench/open_ended.py) as a data file.
$PY -c 'import json; from promptlookup.bench.open_ended import OPEN_ENDED as P
for i, p in enumerate(P): print(json.dumps({"id": f"open_ended-{i:02d}", "task": "open_ended", "messages": [{"role": "user", "content": p}]}))' >"$OUT/open_ended.jsonl"
ready() {  # seconds until $1/v1/models answers
  local start=$(date +%s.%N)
  until curl -sf "$1/v1/models" >/dev/null; do sleep 0.2; done
  echo "$(date +%s.%N) - $start" | bc
}
"$LLAMA" -m "$GGUF" --port 8089 -t 2 -c 8192 ${LLAMA_ARGS---no-repack} --jinja --chat-template "$JOIN" >"$OUT/llama-server.log" 2>&1 &
LLAMA_PID=$!
echo "llama-server ready after $(ready http://127.0.0.1:8089) s" | tee "$OUT/startup.txt"
for start in first second; do
  $PY -m promptlookup serve --model gemma-3-270m --port 8090 --threads 2 --prefix-cache-dir "$BLOCKS/prefix-cache" >"$OUT/serve-$start.log" 2>&1 &
  SERVE_PID=$!
  echo "promptlookup serve ($start start) ready after $(ready http://127.0.0.1:8090) s" | tee -a "$OUT/startup.txt"
  [ "$start" = first ] && kill "$SERVE_PID" && wait "$SERVE_PID" || true
done
trap 'kill $LLAMA_PID $SERVE_PID 2>/dev/null || true; rm -rf "$BLOCKS"' EXIT
$PY -m promptlookup bench --model "$GGUF" --limit "$LIMIT" -n 128 --threads 2 \
  --data "$DATA/code_edit.jsonl" --data "$DATA/summarization.jsonl" \
  --data "$OUT/open_ended.jsonl" --methods promptlookup-none \
  --against llama-server=http://127.0.0.1:8089 --against promptlookup-serve=http://127.0.0.1:8090 \
  --no-progress --out "$OUT"
