"""The long-context session race's memory, turn by turn, in one process: what its peak is
made of. ``benchmarks/long_context_race.sh``'s shape (``--sessions`` editing sessions x
``--turns`` turns over ``--chars`` characters of repository context each, every turn the
whole conversation, the sessions one after another) answered by ``lm.stream`` with a prefix
cache, as ``promptlookup serve``'s worker answers them (its heap setting while busy:
``--map-from`` MiB, 64 as the worker sets it).

Per turn, one Markdown row: the prompt and cached tokens, the resident memory (VmRSS) after
the turn, the turn's peak (VmHWM, reset before it), the bytes the prefix cache holds (its
keys and values, buffers' spare room included), and the freed heap memory the process still
held at the turn's end (what ``malloc_trim`` then gives back, as the server does after a
second without requests: in the race it is idle while the other servers answer). The summary
splits the largest peak: idle, the cache, and the rest (the running request's buffers not yet
counted by the cache, the passes' transients and the heap's slack). ``--no-trim``: nothing
given back between turns (a client that sends the next turn at once). Memory figures do not
depend on the machine's load.

    nice python benchmarks/studies/session_memory.py --max-tokens 40 --chars 18000
"""

from __future__ import annotations

import argparse
import os

import torch

import promptlookup
from promptlookup.bench.memory import peak_rss_mib, reset_peak, rss_mib
from promptlookup.bench.sessions.conversations import LocalChat, build_conversations
from promptlookup.machine import return_freed_memory
from promptlookup.prefix_cache import PrefixCache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens per answer")
    parser.add_argument("--chars", type=int, default=18000, help="each session's context")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix-cache-mib", type=float, default=1024)
    parser.add_argument("--prefix-cache-dir", default=None, help="a disk tier in this folder")
    parser.add_argument(
        "--interleave", action="store_true", help="turn 1 of every session, then turn 2, ..."
    )
    parser.add_argument("--map-from", type=float, default=64, help="MiB (the worker's: 64)")
    parser.add_argument("--no-trim", action="store_true", help="keep freed memory between turns")
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = promptlookup.load_model(args.model)
    lm.warm_up()
    return_freed_memory(map_from=int(args.map_from * 2**20))  # as the server's worker does
    idle = rss_mib()
    cache = PrefixCache(mib=args.prefix_cache_mib, directory=args.prefix_cache_dir)
    chat = LocalChat(lm, prefix_cache=cache)
    print(f"{args.label}: {lm.name}, {args.sessions} sessions x {args.turns} turns, "
          f"{args.max_tokens} tokens per answer, {args.chars} characters of context, "
          f"{args.threads} threads; idle {idle:.0f} MiB\n")  # fmt: skip
    print("| session | turn | prompt | cached | VmRSS after | turn's peak (VmHWM) | "
          "prefix cache | heap slack given back | peak - idle - cache | first token |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = None
    conversations = build_conversations(args.sessions, args.chars)
    answers: dict[str, list[str]] = {c.name: [] for c in conversations}
    turns = [(c, t) for c in conversations for t in range(1, args.turns + 1)]
    if args.interleave:  # every session's turn 1, then every turn 2, ...
        turns.sort(key=lambda pair: pair[1])
    for conversation, turn in turns:
        reset_peak()  # VmHWM from here: this turn's
        said = answers[conversation.name]
        answer = chat.chat(conversation.messages(said), args.max_tokens)
        said.append(answer["text"])
        peak, held, rss = peak_rss_mib(), cache.used_bytes / 2**20, rss_mib()
        slack = 0.0
        if not args.no_trim:
            return_freed_memory()
            slack = rss - rss_mib()
        rest = peak - idle - held
        print(f"| {conversation.name} | {turn} | {answer['prompt_tokens']} | "
                  f"{answer['cached_tokens']} | {rss:.0f} | {peak:.0f} | {held:.1f} | "
                  f"{slack:.1f} | {rest:.0f} | {answer['first_token_seconds']:.2f} s |",
                  flush=True)  # fmt: skip
        if worst is None or peak > worst[0]:
            worst = (peak, held, rest)
    peak, held, rest = worst
    print(f"\nPeak {peak:.0f} MiB = idle {idle:.0f} + prefix cache {held:.0f} (at that turn's "
          f"end) + the rest {rest:.0f}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
