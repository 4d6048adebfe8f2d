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

How the sessions run (modes, servers, the identity check): :mod:`~promptlookup.bench.sessions.cross_request`.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("extraction", "unit_tests", "agent", "file_edits")

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
