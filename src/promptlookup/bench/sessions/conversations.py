"""The bench's multi-turn session mode (``promptlookup bench --sessions N``): editing
conversations in which every turn sends the whole conversation so far, with the method's own
earlier answers, as a chat client or an agent does.

- *Material*, generated at run time like the built-in suite: each session edits one file, the
  short documented functions of one module of the installed Python standard library
  (:func:`~promptlookup.bench.sessions.workload.stdlib_functions`) up to about 6,000
  characters (with ``--session-chars N``, then the next modules' up to about N: a long
  repository context); turn 1 asks for one change and the whole file back, each later turn for another
  change (:data:`~promptlookup.bench.sessions.workload.EDITS`), after the earlier turns and answers.
  Or the rows of ``--data`` files (:class:`ScriptedConversation`): a row's user messages are
  its turns, its assistant messages replaced by each method's own answers.
- *Methods*: servers raced with ``--against`` (sent as they are, so each keeps its own prompt
  cache: llama-server's is on by default; nothing like ``cache_prompt: false`` is sent) and
  ``promptlookup`` in process, with a prefix cache of its own. Each method carries its own
  conversation: its own answers go into its next turns.
- *Order*: session by session, turn by turn, the methods in a rotating order each turn, so a
  slow spell of a shared machine hits all alike.
- *Measured* per turn: time to first token (from sending to the first content chunk), the
  whole turn's seconds, completion tokens (the server's usage), prompt tokens and, where the
  server reports it, ``usage.prompt_tokens_details.cached_tokens``. Per method: end-to-end
  completion tokens/s over all turns (prefill included, as a client waits for it), median
  time to first token on turn 1 and on turns 2 and later, and how many turns' texts equal
  the first method's (greedy).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .workload import EDITS, stdlib_functions


@dataclass
class Conversation:
    """One editing session: its name, its file and the change each turn asks for."""

    name: str
    file: str
    edits: list[str]
    max_turns = None  # as many as asked for (the edits come round again)

    def messages(self, answers: Sequence[str]) -> list[dict]:
        """The messages of the turn after ``answers`` (a method's own answers so far)."""
        messages = [
            {
                "role": "user",
                "content": f"{self.edits[0]}. Output the whole new file in one ```python "
                f"block.\n```python\n{self.file}\n```",
            }
        ]
        for turn, answer in enumerate(answers, start=1):
            messages += [
                {"role": "assistant", "content": answer},
                {
                    "role": "user",
                    "content": f"{self.edits[turn % len(self.edits)]}. Output the whole new "
                    "file again.",
                },
            ]
        return messages


@dataclass
class ScriptedConversation:
    """A conversation from a data row: its system (or developer) messages first, then its user
    messages as the turns, each method's own answers in place of the row's assistant ones.

    >>> row = [{"role": "user", "content": "Fix it."}, {"role": "assistant", "content": "x"},
    ...        {"role": "user", "content": "Shorter."}]
    >>> talk = ScriptedConversation.of("r1", row)
    >>> talk.max_turns, [m["content"] for m in talk.messages(["mine"])]
    (2, ['Fix it.', 'mine', 'Shorter.'])
    """

    name: str
    opening: list[dict]
    users: list[dict]

    @classmethod
    def of(cls, name: str, messages: list[dict]) -> ScriptedConversation:
        opening = [m for m in messages if m["role"] in ("system", "developer")]
        return cls(name, opening, [m for m in messages if m["role"] == "user"])

    @property
    def max_turns(self) -> int:
        return len(self.users)

    def messages(self, answers: Sequence[str]) -> list[dict]:
        """The messages of the turn after ``answers`` (a method's own answers so far)."""
        messages = [*self.opening, self.users[0]]
        for turn, answer in enumerate(answers, start=1):
            messages += [{"role": "assistant", "content": answer}, self.users[turn]]
        return messages


def build_conversations(count: int, file_chars: int | None = None) -> list[Conversation]:
    """``count`` sessions, each over its own module's functions (the modules with the most
    source first). ``file_chars`` None: one module's functions up to about 6,000 characters
    (the built-in sessions). A number: the session's module, then the next modules' in turn
    (wrapping round), up to about ``file_chars`` characters: a long repository context
    (``bench --session-chars``)."""
    by_module: dict[str, list[str]] = {}
    for function in stdlib_functions():
        by_module.setdefault(function.module, []).append(function.source)
    modules = sorted(by_module, key=lambda name: -sum(map(len, by_module[name])))
    limit = file_chars or 6000
    conversations = []
    for number in range(count):
        # the session's module first; with file_chars, the following modules after it
        following = range(len(modules)) if file_chars else range(1)
        sources = [
            source
            for step in following
            for source in by_module[modules[(number + step) % len(modules)]]
        ]
        parts, size = [], 0
        for source in sources:
            if size >= limit:
                break
            parts.append(source)
            size += len(source) + 3
        edits = [EDITS[(number + turn) % len(EDITS)] for turn in range(len(EDITS))]
        module = modules[number % len(modules)]
        conversations.append(Conversation(f"{module}-{number + 1}", "\n\n\n".join(parts), edits))
    return conversations


@dataclass
class Turn:
    """One answered turn of one method."""

    session: str
    turn: int  # 1-based
    method: str
    prompt_tokens: int | None
    cached_tokens: int | None  # None: not reported
    completion_tokens: int
    first_token_seconds: float
    seconds: float
    text: str


class LocalChat:
    """``promptlookup`` in this process: ``lm.stream`` with a prefix cache of its own."""

    def __init__(self, lm, name: str = "promptlookup", prefix_cache=None) -> None:
        from ...prefix_cache import PrefixCache

        self.name, self.lm = name, lm
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()

    def chat(self, messages: list[dict], max_tokens: int) -> dict:
        start = time.perf_counter()
        stream = self.lm.stream(messages, max_new_tokens=max_tokens, prefix_cache=self.prefix_cache)
        first, pieces = None, []
        for piece in stream:
            first = first if first is not None else time.perf_counter() - start
            pieces.append(piece)
        seconds = time.perf_counter() - start
        stats = stream.result.stats
        return {
            "text": "".join(pieces),
            "first_token_seconds": first if first is not None else seconds,
            "seconds": seconds,
            "completion_tokens": stats.new_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
        }


def run_conversations(
    methods: Sequence,
    conversations: Sequence[Conversation],
    turns: int,
    max_tokens: int,
    log: Callable[[str], None] = print,
    on_turn: Callable[[Turn], None] | None = None,
) -> list[Turn]:
    """Every conversation's ``turns`` turns through every method (see the module doc);
    ``methods``: objects with ``name`` and ``chat(messages, max_tokens) -> dict``
    (:class:`LocalChat`, :class:`~promptlookup.bench.servers.ServerMethod`); ``on_turn``
    is given each turn as it is answered."""
    records: list[Turn] = []
    rotation = 0
    for conversation in conversations:
        answers: dict[str, list[str]] = {method.name: [] for method in methods}
        for turn in range(1, min(turns, conversation.max_turns or turns) + 1):
            order = [*methods[rotation % len(methods) :], *methods[: rotation % len(methods)]]
            rotation += 1
            for method in order:
                messages = conversation.messages(answers[method.name])
                answer = method.chat(messages, max_tokens)
                answers[method.name].append(answer["text"])
                records.append(Turn(conversation.name, turn, method.name, **answer))
                if on_turn is not None:
                    on_turn(records[-1])
            log(
                f"{conversation.name} turn {turn}/{min(turns, conversation.max_turns or turns)}: "
                + ", ".join(
                    f"{r.method} {r.completion_tokens} tokens, first after "
                    f"{r.first_token_seconds:.2f} s, {r.seconds:.2f} s"
                    + ("" if r.cached_tokens is None else f", {r.cached_tokens} cached")
                    for r in records[-len(methods) :]
                )
            )
    return records


def summary(records: Sequence[Turn], methods: Sequence[str]) -> dict[str, dict]:
    """Per method: end-to-end completion tokens/s, median time to first token on turn 1 and
    on later turns, prompt and cached tokens, and the turns whose text equals the first
    method's."""
    first = {(r.session, r.turn): r.text for r in records if r.method == methods[0]}
    table = {}
    for method in methods:
        own = [r for r in records if r.method == method]
        seconds = sum(r.seconds for r in own)
        later = [r.first_token_seconds for r in own if r.turn > 1]
        table[method] = {
            "turns": len(own),
            "completion_tokens": sum(r.completion_tokens for r in own),
            "seconds": round(seconds, 3),
            "tokens_per_second": round(sum(r.completion_tokens for r in own) / seconds, 2)
            if seconds
            else 0.0,
            "median_ttft_turn_1": round(
                statistics.median([r.first_token_seconds for r in own if r.turn == 1]), 3
            )
            if own
            else None,
            "median_ttft_later_turns": round(statistics.median(later), 3) if later else None,
            "prompt_tokens": sum(r.prompt_tokens or 0 for r in own),
            "cached_tokens": None
            if any(r.cached_tokens is None for r in own)
            else sum(r.cached_tokens for r in own),
            "same_text_as_first": sum(first.get((r.session, r.turn)) == r.text for r in own),
        }
    return table


def report(records: Sequence[Turn], methods: Sequence[str]) -> str:
    """A markdown table of :func:`summary`, each method's ratios to the last method's."""
    table = summary(records, methods)
    base = table[methods[-1]]
    lines = [
        f"| method | turns | completion tokens | tokens/s | x {methods[-1]} | median TTFT turn 1 "
        f"(s) | median TTFT turns 2+ (s) | prompt tokens | cached | same text as {methods[0]} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        row = table[method]
        ratio = row["tokens_per_second"] / base["tokens_per_second"]
        cached = "-" if row["cached_tokens"] is None else row["cached_tokens"]
        lines.append(
            f"| {method} | {row['turns']} | {row['completion_tokens']} | "
            f"{row['tokens_per_second']:.1f} | {ratio:.2f} | {row['median_ttft_turn_1']} | "
            f"{row['median_ttft_later_turns']} | {row['prompt_tokens']} | {cached} | "
            f"{row['same_text_as_first']}/{row['turns']} |"
        )
    return "\n".join(lines)


def session_bench(
    *,
    sessions: int,
    turns: int,
    max_tokens: int,
    methods: str,
    against: Sequence[str],
    model,
    dtype: str,
    device: str,
    threads: int | None,
    out_dir: str,
    command: str,
    rows: Sequence = (),
    file_chars: int | None = None,
) -> None:
    """``promptlookup bench --sessions N``: run, print and save (OUT/sessions.jsonl, each turn
    as it is answered, and OUT/sessions.md) the session mode, over the first N of ``rows`` (data files' rows,
    :class:`ScriptedConversation`) where given, else N built-in editing sessions (their files
    about ``file_chars`` characters long: :func:`build_conversations`)."""
    import json
    import sys
    from pathlib import Path

    from ...errors import InvalidParameterError
    from ..servers import ServerMethod, parse_against

    local = [name for name in methods.split(",") if name.strip() and name.strip() != "none"]
    if any(name.strip() != "promptlookup" for name in local):
        raise InvalidParameterError(
            "with --sessions, --methods is promptlookup (in process) or none; race servers "
            "with --against"
        )
    racing = [ServerMethod(*parse_against(item), keep_cache=True) for item in against]
    chats: list = list(racing)
    if local:
        import torch

        import promptlookup

        if threads:
            torch.set_num_threads(threads)
        lm = promptlookup.load_model(model, dtype=dtype, device=device)
        lm.warm_up()
        chats.insert(0, LocalChat(lm))
    if not chats:
        raise InvalidParameterError("--sessions needs a method: promptlookup or --against")
    names = [chat.name for chat in chats]
    conversations = (
        [ScriptedConversation.of(f"{row.task}-{row.id}", row.messages) for row in rows[:sessions]]
        if rows
        else build_conversations(sessions, file_chars)
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sessions.jsonl", "w", encoding="utf-8") as handle:

        def keep(record: Turn) -> None:  # as it goes: a long run stopped early keeps its turns
            handle.write(json.dumps(asdict(record)) + "\n")
            handle.flush()

        records = run_conversations(
            chats,
            conversations,
            turns,
            max_tokens,
            log=lambda line: print(line, file=sys.stderr, flush=True),
            on_turn=keep,
        )
    text = (
        f"Session mode: {len(conversations)} conversation(s) x up to {turns} turns, max_tokens "
        f"{max_tokens}, "
        f"greedy.\nCommand: `{command}`\n\n{report(records, names)}\n"
    )
    print(text)
    (out / "sessions.md").write_text(text, encoding="utf-8")
