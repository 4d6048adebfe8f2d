#!/bin/bash
# The session race of docs/server.md: promptlookup serve (defaults; and --prefix-cache-mib 0)
# against llama-server with its defaults (prompt cache on), 2 threads each, default model.
# DATA=FILE.jsonl: the conversations of a data file (its user messages the turns) instead of
# the built-in editing sessions. LLAMA_ARGS: extra llama-server flags, --no-repack unless set (a -DGGML_NATIVE=ON build's AMX
# repacked weights crash on this VM; with a NATIVE=OFF build, run with LLAMA_ARGS= ).
set -e
GGUF=$(python -c "from promptlookup.models import resolve_model as r; s=r(None); print(s.location + '/' + s.gguf_file)")
LLAMA=${LLAMA_SERVER:-/work/llamacpp/build/bin/llama-server}
OUT=${OUT:-prefix-cache-sessions}
python -m promptlookup serve --port 18001 --threads ${THREADS:-2} > /tmp/pl-cache.log 2>&1 & P1=$!
python -m promptlookup serve --port 18003 --threads ${THREADS:-2} --prefix-cache-mib 0 > /tmp/pl-nocache.log 2>&1 & P2=$!
$LLAMA -m "$GGUF" -t ${THREADS:-2} ${LLAMA_ARGS---no-repack} --port 18002 > /tmp/llama-server.log 2>&1 & P3=$!
trap 'kill $P1 $P2 $P3' EXIT
for port in 18001 18002 18003; do
  until curl -sf localhost:$port/health > /dev/null; do sleep 2; done
done
python -m promptlookup bench --sessions ${SESSIONS:-4} --turns ${TURNS:-5} --max-new-tokens ${MAX_TOKENS:-256} \
  ${DATA:+--data "$DATA"} --methods none --against promptlookup=http://127.0.0.1:18001 \
  --against promptlookup-no-cache=http://127.0.0.1:18003 \
  --against llama-server=http://127.0.0.1:18002 --out "$OUT"
