#!/bin/bash
# 8 requests sharing a long prefix, all at once, after one by one: promptlookup serve (defaults)
# against llama-server -np 8 (its defaults otherwise, prompt cache on), 2 threads each.
# LLAMA_ARGS: extra llama-server flags, --no-repack unless set (see prefix_cache_sessions.sh).
set -e
GGUF=$(python -c "from promptlookup.models import resolve_model as r; s=r(None); print(s.location + '/' + s.gguf_file)")
LLAMA=${LLAMA_SERVER:-/work/llamacpp/build/bin/llama-server}
OUT=${OUT:-prefix-cache-shared}
python -m promptlookup serve --port 18011 --threads ${THREADS:-2} > /tmp/pl-shared.log 2>&1 & P1=$!
$LLAMA -m "$GGUF" -t ${THREADS:-2} -np 8 ${LLAMA_ARGS---no-repack} --port 18012 > /tmp/llama-shared.log 2>&1 & P2=$!
trap 'kill $P1 $P2' EXIT
for port in 18011 18012; do
  until curl -sf localhost:$port/health > /dev/null; do sleep 2; done
done
python benchmarks/prefix_cache.py shared --against promptlookup=http://127.0.0.1:18011 \
  --against llama-server-np8=http://127.0.0.1:18012 --out "$OUT"
