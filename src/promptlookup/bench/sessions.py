"""A session workload: request *sequences* whose later answers repeat earlier ones in
structure, for measuring a :class:`~promptlookup.drafters.CrossRequestIndex`.

The material is the installed Python standard library's own source (read at run time with
:mod:`inspect`; nothing of it is stored in this repository): short documented functions of a
fixed list of pure-Python modules, in a fixed order. Four kinds of session, each a sequence of
``requests`` chat requests:

- ``extraction``: one function per request, answered as a JSON object of a fixed shape;
- ``unit_tests``: one function per request, answered as a pytest module of a fixed layout;
- ``agent``: an agent loop over one module, every step answered with the same tool-call
  format, the previous steps (the model's own answers and their observations) in the prompt;
- ``file_edits``: one file (a module's functions) edited again and again, each request asking
  for the whole file back with another change.

Modes: ``off`` (prompt lookup, no index), ``per-key`` (one index per session, as the server
shares one per API key, each session a client) and ``global`` (one index for all sessions).
Sessions run one after another (concurrency 1), or ``concurrency`` at a time with
:meth:`~promptlookup.LanguageModel.generate_batch` (their n-th requests together). Modes are
interleaved request by request in a rotating order, so a slow spell of a shared machine hits
all alike. Every mode's output must equal the ``off`` mode's, token for token (the index only
drafts); :func:`run_sessions` checks it.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..drafters import CrossRequestIndex

KINDS = ("extraction", "unit_tests", "agent", "file_edits")
MODES = ("off", "per-key", "global")

#: Pure-Python standard library modules the workload reads functions from.
MODULES = (
    "textwrap",
    "shlex",
    "fnmatch",
    "posixpath",
    "heapq",
    "bisect",
    "calendar",
    "colorsys",
    "statistics",
    "base64",
    "difflib",
    "glob",
    "html",
    "ipaddress",
    "keyword",
    "linecache",
    "ntpath",
    "operator",
    "pprint",
    "quopri",
    "random",
    "reprlib",
    "shutil",
    "string",
    "tokenize",
    "uuid",
)

EXTRACTION = (
    "Extract the function's interface as one JSON object with exactly these keys, in this "
    'order: {"name": "...", "module": "...", "parameters": [{"name": "...", "default": '
    'null}], "returns": "...", "raises": ["..."], "summary": "..."}. Answer with the JSON '
    "object only."
)
UNIT_TESTS = (
    "Write a pytest test module for the function below. Use this layout: `import pytest`, "
    "then `from MODULE import NAME`, then three functions named `test_NAME_basic`, "
    "`test_NAME_edge_case` and `test_NAME_invalid_input`, each with one assert or "
    "pytest.raises. Answer with the code only, in one ```python block."
)
AGENT = (
    "You are a coding agent exploring a Python module. Each turn, answer with exactly one "
    'tool call and nothing else, in this format:\n<tool_call>{"name": "read_function", '
    '"arguments": {"module": "...", "function": "..."}}</tool_call>\nAvailable tools: '
    "read_function(module, function), search(module, query), finish(answer)."
)
EDITS = (
    "Rename the parameters to longer, clearer names",
    "Add a one-line comment above every return statement",
    "Add type hints to every function signature",
    "Replace every double-quoted string with a single-quoted one",
    "Add a blank line after every docstring",
    "Rewrite each docstring as a single short sentence",
    "Add an assert at the start of each function checking its first argument is not None",
    "Rename each function by adding the prefix `my_`",
)


@dataclass(frozen=True)
class Function:
    """One standard-library function: its module, name and source."""

    module: str
    name: str
    source: str


def stdlib_functions(max_lines: int = 30) -> list[Function]:
    """Documented functions of :data:`MODULES` with at most ``max_lines`` lines of source,
    module by module, each module's in name order (what this interpreter has installed)."""
    found = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, function in sorted(inspect.getmembers(module, inspect.isfunction)):
            if function.__module__ != module_name or name.startswith("_") or not function.__doc__:
                continue
            try:
                source = textwrap.dedent(inspect.getsource(function))
            except (OSError, TypeError):
                continue
            if 4 <= source.count("\n") <= max_lines:
                found.append(Function(module_name, name, source.rstrip()))
    return found


@dataclass
class Session:
    """One session: its kind, a name, and how to build each request's messages (the agent
    kind's prompt holds the session's earlier answers, so it is built as the session runs)."""

    kind: str
    name: str
    functions: list[Function]
    answers: list[str] = field(default_factory=list)

    def messages(self, step: int) -> list[dict]:
        """The chat messages of request ``step`` (0-based), given the answers so far."""
        function = self.functions[step % len(self.functions)]
        if self.kind == "extraction":
            return [
                {"role": "system", "content": EXTRACTION},
                {"role": "user", "content": f"Module `{function.module}`:\n{function.source}"},
            ]
        if self.kind == "unit_tests":
            return [
                {"role": "system", "content": UNIT_TESTS},
                {"role": "user", "content": f"Module `{function.module}`:\n{function.source}"},
            ]
        if self.kind == "agent":
            names = ", ".join(f.name for f in self.functions)
            history = []
            for earlier, answer in list(enumerate(self.answers))[-2:]:  # the last two turns
                seen = self.functions[earlier % len(self.functions)]
                history += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"Observation:\n{seen.source}\nNext tool call."},
                ]
            task = (
                f"Task: document every public function of module `{function.module}` "
                f"({names}). Read them one at a time. Next: `{function.name}`."
            )
            return [
                {"role": "system", "content": AGENT},
                {"role": "user", "content": task},
                *history,
            ]
        # file_edits: the same file every time, another change each time
        file = "\n\n\n".join(f.source for f in self.functions[:3])
        edit = EDITS[step % len(EDITS)]
        return [
            {
                "role": "user",
                "content": f"{edit}. Output the whole new file in one ```python block.\n"
                f"```python\n{file}\n```",
            }
        ]


def build_sessions(
    kinds: Sequence[str] = KINDS, per_kind: int = 2, requests: int = 6
) -> list[Session]:
    """``per_kind`` sessions of each kind, of ``requests`` requests each; each session takes
    its own functions (the agent and edit kinds: of one module)."""
    functions = stdlib_functions()
    by_module: dict[str, list[Function]] = {}
    for function in functions:
        by_module.setdefault(function.module, []).append(function)
    modules = [name for name, group in by_module.items() if len(group) >= 3]
    sessions, cursor = [], 0
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown session kind {kind!r}; choose from {', '.join(KINDS)}")
        for number in range(per_kind):
            if kind in ("agent", "file_edits"):  # a module of its own per session
                group = by_module[modules[(cursor + 3 * number) % len(modules)]]
            else:
                start = (cursor + number * requests) % len(functions)
                group = (functions[start:] + functions[:start])[:requests]
            sessions.append(Session(kind, f"{kind}-{number + 1}", list(group)))
        cursor += per_kind * requests + 1
    return sessions


@dataclass
class Tally:
    """What one mode did over some requests."""

    requests: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    seconds: float = 0.0
    #: After each request's first token (its prompt's prefill and first pass left out).
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    def add(self, stats, seconds: float) -> None:
        self.requests += 1
        self.new_tokens += stats.new_tokens
        self.forward_passes += stats.forward_passes
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        self.seconds += seconds
        if stats.token_seconds:
            self.decode_tokens += stats.new_tokens - 1
            self.decode_seconds += stats.token_seconds[-1] - stats.token_seconds[0]

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0


@dataclass
class SessionRun:
    """A run's tallies by ``(kind, mode)`` (kind ``"all"``: every session), whether every
    output equalled the ``off`` mode's, and the indexes' sizes at the end."""

    tallies: dict[tuple[str, str], Tally]
    identical: bool
    mismatches: list[str]
    index_tokens: dict[str, int]
    #: One record per session, step and mode: its counts, seconds and (index off) text.
    records: list[dict] = field(default_factory=list)


def run_sessions(
    lm,
    sessions: Sequence[Session],
    *,
    modes: Sequence[str] = MODES,
    max_new_tokens: int = 160,
    requests: int = 6,
    concurrency: int = 1,
    max_tokens: int = 32768,
    log=print,
) -> SessionRun:
    """Run every session under every mode (see the module doc) and tally tokens, passes and
    generation time (prompt prefill included, as a client waits for it)."""
    modes = ["off", *[mode for mode in modes if mode != "off"]]
    tallies: dict[tuple[str, str], Tally] = {}
    per_key = {session.name: CrossRequestIndex(max_tokens) for session in sessions}
    shared = CrossRequestIndex(max_tokens)
    mismatches: list[str] = []
    records: list[dict] = []

    def index_of(mode: str, session: Session) -> CrossRequestIndex | None:
        return {"off": None, "per-key": per_key[session.name], "global": shared}[mode]

    turn = 0
    groups = [sessions[i : i + concurrency] for i in range(0, len(sessions), concurrency)]
    # A warm-up, not recorded: the first passes of a batch size learn its cost curve.
    _generate(lm, [session.messages(0) for session in groups[0]], [None] * len(groups[0]), 8)
    for group in groups:
        for step in range(requests):
            prompts = [session.messages(step) for session in group]
            outputs, spent = {}, {}
            for mode in modes[turn % len(modes) :] + modes[: turn % len(modes)]:
                indexes = [index_of(mode, session) for session in group]
                start = time.perf_counter()
                results = _generate(lm, prompts, indexes, max_new_tokens)
                seconds = (time.perf_counter() - start) / len(results)  # concurrency 1: all
                outputs[mode], spent[mode] = results, seconds * len(results)
                for session, result in zip(group, results):
                    for kind in (session.kind, "all"):
                        tallies.setdefault((kind, mode), Tally()).add(result.stats, seconds)
            turn += 1
            for position, session in enumerate(group):
                expected = outputs["off"][position].token_ids
                for mode in modes:
                    if outputs[mode][position].token_ids != expected:
                        mismatches.append(f"{session.name} step {step} mode {mode}")
                session.answers.append(outputs["off"][position].text)
                for mode in modes:
                    stats = outputs[mode][position].stats
                    records.append(
                        {
                            "session": session.name,
                            "step": step,
                            "mode": mode,
                            "new_tokens": stats.new_tokens,
                            "forward_passes": stats.forward_passes,
                            "seconds": round(spent[mode] / len(group), 3),
                            "text": outputs[mode][position].text if mode == "off" else None,
                        }
                    )
            log(
                f"{', '.join(s.name for s in group)} step {step + 1}/{requests}: "
                + ", ".join(
                    f"{mode} {sum(r.stats.new_tokens for r in outputs[mode])} tokens in "
                    f"{sum(r.stats.forward_passes for r in outputs[mode])} passes, "
                    f"{spent[mode]:.2f} s"
                    for mode in modes
                )
            )
    sizes = {"global": len(shared), "per-key": sum(map(len, per_key.values()))}
    return SessionRun(tallies, not mismatches, mismatches, sizes, records)


@dataclass
class _Output:
    token_ids: list[int]
    text: str
    stats: object


def _generate(lm, prompts, indexes, max_new_tokens) -> list[_Output]:
    """One request alone (``lm.generate``), or several in shared forward passes, each with its
    own index (``generate_batch`` takes one set of options for all its prompts)."""
    if len(prompts) == 1:
        result = lm.generate(prompts[0], max_new_tokens=max_new_tokens, cross_request=indexes[0])
        return [_Output(result.token_ids, result.text, result.stats)]
    from ..batching import BatchDecoder

    decoder = BatchDecoder(lm.target, lm.policy, max_batch=len(prompts))
    sequences = []
    for prompt, index in zip(prompts, indexes):
        sequence, _ = lm.batch_sequence(prompt, max_new_tokens=max_new_tokens, cross_request=index)
        sequences.append(decoder.add(sequence))
    for _ in decoder.run():
        pass
    outputs = []
    for sequence in sequences:
        new = list(sequence.tokens[len(sequence.prompt_ids) :])
        outputs.append(
            _Output(new, lm.tokenizer.decode(new, skip_special_tokens=True), sequence.stats)
        )
    return outputs


def report(run: SessionRun, modes: Sequence[str] = MODES) -> str:
    """A markdown table: per kind and mode, tokens per forward pass, tokens/s (whole requests,
    prefill included; and decode only, after each first token) and the speed-ups over
    ``off``."""
    modes = ["off", *[mode for mode in modes if mode != "off"]]
    lines = [
        "| kind | mode | requests | new tokens | passes | tokens/pass | tokens/s | x off "
        "| decode tokens/s | x off |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kinds = [kind for kind in (*KINDS, "all") if (kind, "off") in run.tallies]
    for kind in kinds:
        base = run.tallies[(kind, "off")]
        for mode in modes:
            tally = run.tallies[(kind, mode)]
            lines.append(
                f"| {kind} | {mode} | {tally.requests} | {tally.new_tokens} | "
                f"{tally.forward_passes} | {tally.tokens_per_pass:.2f} | "
                f"{tally.tokens_per_second:.1f} | "
                f"{_ratio(tally.tokens_per_second, base.tokens_per_second)} | "
                f"{tally.decode_tokens_per_second:.1f} | "
                f"{_ratio(tally.decode_tokens_per_second, base.decode_tokens_per_second)} |"
            )
    verdict = "identical" if run.identical else f"DIFFERENT: {', '.join(run.mismatches)}"
    lines.append(f"\nOutputs with the index against without: {verdict}.")
    lines.append(f"Index tokens held at the end: {run.index_tokens}.")
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"
