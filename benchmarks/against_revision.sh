#!/bin/bash
# This checkout's `promptlookup serve` raced against another revision's (REV, default 4980f63:
# 0.15.0), interleaved through the same API, default model, 2 threads each: the session race
# (4 conversations x 5 turns, 256 tokens) and the single-stream race (the built-in suite,
# LIMIT prompts per task, 128 tokens). Three servers: REV's, this checkout's with NEW_ARGS
# (default --kv-dtype float32: the same keys and values as 0.15.0, so the same texts) and this
# checkout's with its defaults. Outputs under OUT/sessions and OUT/single.
set -e
REV=${REV:-4980f63}
OLD=${OLD:-/tmp/promptlookup-$REV}
OUT=${OUT:-against-$REV}
[ -d "$OLD" ] || git worktree add --detach "$OLD" "$REV"
PYTHONPATH="$OLD/src" python -m promptlookup serve --port 18201 --threads ${THREADS:-2} > /tmp/pl-old.log 2>&1 & P1=$!
python -m promptlookup serve --port 18202 --threads ${THREADS:-2} ${NEW_ARGS---kv-dtype float32} > /tmp/pl-new.log 2>&1 & P2=$!
python -m promptlookup serve --port 18203 --threads ${THREADS:-2} > /tmp/pl-default.log 2>&1 & P3=$!
trap 'kill $P1 $P2 $P3' EXIT
for port in 18201 18202 18203; do
  until curl -sf localhost:$port/health > /dev/null; do sleep 2; done
done
SERVERS="--against old=http://127.0.0.1:18201 --against new=http://127.0.0.1:18202 --against new-default=http://127.0.0.1:18203"
python -m promptlookup bench --sessions ${SESSIONS:-4} --turns ${TURNS:-5} --max-new-tokens 256 \
  --methods none $SERVERS --out "$OUT/sessions"
python -m promptlookup bench --limit ${LIMIT:-3} --max-new-tokens 128 --methods plain $SERVERS \
  --out "$OUT/single"
