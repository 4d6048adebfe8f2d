#!/bin/bash
# The long-context session race of issue 53: `promptlookup serve` (defaults, its disk tier in
# a fresh folder), `promptlookup
# serve --prefix-cache-mib 0` and llama-server (its defaults), 2 threads each, default model,
# greedy, interleaved through the OpenAI API: SESSIONS editing sessions x TURNS turns x
# MAX_TOKENS tokens, each session's file CHARS characters of the standard library's Python
# (18,000: 4,800-5,500 tokens of repository context with the default model's tokenizer), each
# turn the whole conversation so far. Memory: each server's VmRSS and VmHWM (peak resident)
# from /proc/PID/status once it answers /health (idle, before any request) and after the run.
# Output in OUT: sessions.md and sessions.jsonl (the bench's), memory.json, summary.json (the
# bench's summary per method with its memory) and report.md (both, and the load average).
# LLAMA_SERVER: the llama-server binary; LLAMA_ARGS: extra llama-server flags (none unless set;
# a -DGGML_NATIVE=ON build's AMX-repacked weights crash on some machines: LLAMA_ARGS=--no-repack).
# PY: the Python with promptlookup installed. About 17 minutes on 2 quiet cores (runs/
# long-context-0.15.0); under load it stretches: at a load average of 25, turn 1 alone took
# 16-26 minutes per server. OUT/sessions.jsonl and OUT/idle-memory.txt are written as it goes.
set -euo pipefail
PY=${PY:-python}
GGUF=$($PY -c "from promptlookup.models import resolve_model as r; s=r(None); print(s.location + '/' + s.gguf_file)")
LLAMA=${LLAMA_SERVER:-/work/llama-build/build/bin/llama-server}
OUT=${OUT:-long-context-race}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
# serve's default disk tier (--prefix-cache-dir auto), in a folder of its own: the user's may
# hold an earlier run's conversations. Removed at the end.
BLOCKS=$(mktemp -d)
$PY -m promptlookup serve --port 18301 --threads "$THREADS" --prefix-cache-dir "$BLOCKS/prefix-cache" >"$OUT/promptlookup.log" 2>&1 & P1=$!
$PY -m promptlookup serve --port 18302 --threads "$THREADS" --prefix-cache-mib 0 >"$OUT/promptlookup-no-cache.log" 2>&1 & P2=$!
# shellcheck disable=SC2086
"$LLAMA" -m "$GGUF" -t "$THREADS" ${LLAMA_ARGS:-} --port 18303 >"$OUT/llama-server.log" 2>&1 & P3=$!
trap 'kill $P1 $P2 $P3 2>/dev/null || true; rm -rf "$BLOCKS"' EXIT
for port in 18301 18302 18303; do
  until curl -sf localhost:$port/health >/dev/null; do sleep 1; done
done
memory() {  # "VmRSS VmHWM" of process $1, in KiB
  awk '/^VmRSS|^VmHWM/ {v[$1] = $2} END {print v["VmRSS:"], v["VmHWM:"]}' "/proc/$1/status"
}
IDLE1=$(memory $P1) IDLE2=$(memory $P2) IDLE3=$(memory $P3)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# Kept at once (KiB: VmRSS VmHWM), so that a run stopped early still has them.
printf 'promptlookup %s\npromptlookup-no-cache %s\nllama-server %s\nload %s\n' \
  "$IDLE1" "$IDLE2" "$IDLE3" "$LOAD_BEFORE" >"$OUT/idle-memory.txt"
$PY -m promptlookup bench --sessions "${SESSIONS:-4}" --turns "${TURNS:-4}" \
  --max-new-tokens "${MAX_TOKENS:-200}" --session-chars "${CHARS:-18000}" --methods none \
  --against promptlookup=http://127.0.0.1:18301 \
  --against promptlookup-no-cache=http://127.0.0.1:18302 \
  --against llama-server=http://127.0.0.1:18303 --out "$OUT"
AFTER1=$(memory $P1) AFTER2=$(memory $P2) AFTER3=$(memory $P3)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
# The figures as JSON (MiB), beside the bench's summary, and the report.
OUT="$OUT" LOADS="$LOAD_BEFORE|$LOAD_AFTER" FIGURES="promptlookup $IDLE1 $AFTER1
promptlookup-no-cache $IDLE2 $AFTER2
llama-server $IDLE3 $AFTER3" $PY - <<'EOF'
import json, os
from pathlib import Path
from promptlookup.bench.sessions.conversations import Turn, summary
out = Path(os.environ["OUT"])
memory = {}
for line in os.environ["FIGURES"].splitlines():
    name, *kib = line.split()
    idle_rss, idle_hwm, rss, hwm = (round(int(k) / 1024) for k in kib)
    memory[name] = {"idle_rss_mib": idle_rss, "idle_peak_mib": idle_hwm,
                    "rss_after_mib": rss, "peak_mib": hwm}
before, after = os.environ["LOADS"].split("|")
(out / "memory.json").write_text(json.dumps(memory, indent=1) + "\n")
records = [Turn(**json.loads(line)) for line in (out / "sessions.jsonl").open()]
table = summary(records, list(memory))
for name, row in table.items():
    row["memory"] = memory[name]
(out / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
base = memory["llama-server"]["peak_mib"]
lines = ["| server | idle RSS (MiB) | RSS after the run | peak resident (VmHWM) | x llama-server |",
         "|---|---:|---:|---:|---:|"]
for name, row in memory.items():
    lines.append(f"| {name} | {row['idle_rss_mib']:,} | {row['rss_after_mib']:,} | "
                 f"{row['peak_mib']:,} | {row['peak_mib'] / base:.2f} |")
text = (out / "sessions.md").read_text()
(out / "report.md").write_text(
    f"{text}\nMemory (from /proc/PID/status: idle once /health answered, before any request; "
    f"after the run):\n\n" + "\n".join(lines)
    + f"\n\nLoad average (1, 5, 15 min) before the run: {before}; after: {after}.\n")
print((out / "report.md").read_text())
EOF
