"""The built-in suite: bench prompts of the five tasks, generated at run time from the installed
Python standard library's own sources and docstrings (PSF licence), so that any machine with
Python can run ``promptlookup bench`` without data files.

Each task builds requests of the same shape as the project's evaluation sets (``{"id", "task",
"messages"}``, the context and the instruction in the last user turn):

- ``code_edit``: one function's source and an edit (rename a parameter, add a docstring, add
  type hints), answered with the whole function.
- ``summarization``: the opening of a module (its docstring and first definitions), summarised.
- ``qa``: a few consecutive definitions of a module and a question whose answer is a short
  phrase of them (a parameter's default value, the exceptions a function raises).
- ``chat``: a function and its docstring as the assistant's first answer, then a request to
  rewrite that answer.
- ``open_ended``: requests with nothing to copy (:data:`OPEN_ENDED`).

Determinism: modules are the standard library's top-level ``.py`` files in sorted order,
shuffled with a fixed seed per task; each task takes at most one function per module, the first
that fits. The same Python version gives the same prompts (:func:`suite_fingerprint` names
them); another version's sources give other prompts of the same kinds. Nothing is imported: the
files are read and parsed with :mod:`ast`.

>>> rows = suite_rows(limit=1)
>>> [row.task for row in rows]
['code_edit', 'summarization', 'qa', 'chat', 'open_ended']
>>> suite_rows(limit=2)[0] == rows[0] and suite_fingerprint(rows) == suite_fingerprint(rows)
True
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import random
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .data import BenchRow
from .open_ended import OPEN_ENDED

TASKS = ("code_edit", "summarization", "qa", "chat", "open_ended")
#: Prompts per task when ``--limit`` is not given.
DEFAULT_PER_TASK = 12
SEED = 35
#: Modules whose import or text is not code to work on.
SKIP = {"antigravity", "this"}
FENCE = "```"


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    tree: ast.Module
    lines: tuple[str, ...]


def stdlib_folder() -> Path:
    """The folder of the running Python's pure-Python standard library."""
    return Path(inspect.getfile(os)).parent


@cache
def _module_names() -> tuple[str, ...]:
    folder = stdlib_folder()
    return tuple(
        sorted(
            path.stem
            for path in folder.glob("*.py")
            if not path.name.startswith("_") and path.stem not in SKIP
        )
    )


@cache
def _module(name: str) -> Module | None:
    try:
        source = (stdlib_folder() / f"{name}.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    return Module(name, source, tree, tuple(source.splitlines()))


def _modules(task: str) -> Iterator[Module]:
    """Every module once, in the task's fixed shuffled order (parsed as they are reached)."""
    names = list(_module_names())
    random.Random(f"{SEED}:{task}").shuffle(names)
    for name in names:
        module = _module(name)
        if module is not None:
            yield module


def _segment(module: Module, node: ast.AST, drop_docstring: bool = False) -> str:
    """A node's source lines (decorators included), optionally without its docstring."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    lines = list(module.lines[start - 1 : node.end_lineno])
    doc = _docstring_node(node) if drop_docstring else None
    if doc is not None:
        del lines[doc.lineno - start : doc.end_lineno - start + 1]
    return textwrap.dedent("\n".join(lines)) + "\n"


def _docstring_node(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str) and len(body) > 1:
            return body[0]
    return None


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _functions(module: Module) -> list[tuple[str, ast.FunctionDef]]:
    """``(qualified name, node)`` of the public top-level functions and the methods of public
    top-level classes, in source order."""
    found = []
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef) and _public(node.name):
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            found += [
                (f"{node.name}.{n.name}", n)
                for n in node.body
                if isinstance(n, ast.FunctionDef) and _public(n.name)
            ]
    return found


def _parameters(function: ast.FunctionDef) -> list[ast.arg]:
    args = function.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    return [a for a in every if a.arg not in ("self", "cls")]


def _fits(text: str, low: int, high: int) -> bool:
    return low <= len(text) <= high


# -- code_edit --------------------------------------------------------------------------------


def _code_edit(module: Module, index: int) -> str | None:
    kind = index % 3
    for name, function in _functions(module):
        code = _segment(module, function)
        if not _fits(code, 500, 3500):
            continue
        if kind == 0:  # rename a parameter the body uses
            used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
            params = [a.arg for a in _parameters(function) if len(a.arg) > 1 and a.arg in used]
            if not params:
                continue
            old = params[0]
            ask = (
                f"Rename the parameter `{old}` of `{name}` to `new_{old}` everywhere in the "
                "function, changing nothing else."
            )
        elif kind == 1:  # document an undocumented function
            if ast.get_docstring(function) is not None:
                continue
            ask = (
                f"Add a docstring to `{name}` that says what it does, what its parameters "
                "are and what it returns."
            )
        else:  # annotate an unannotated function
            if function.returns or any(a.annotation for a in _parameters(function)):
                continue
            if not _parameters(function):
                continue
            ask = f"Add type hints to the parameters and the return value of `{name}`."
        return (
            f"Here is `{name}` from Python's `{module.name}` module:\n\n"
            f"{FENCE}python\n{code}{FENCE}\n\n{ask} Reply with the complete updated function "
            "in a Python code block."
        )
    return None


# -- summarization ----------------------------------------------------------------------------

SUMMARY_ASKS = (
    "Summarise what this module provides in 3 sentences.",
    "Write a short paragraph for a new contributor that summarises what this code does.",
)


def _opening(module: Module, low: int, high: int) -> str | None:
    """The module's first lines, cut after the last top-level statement within ``high``."""
    end = 0
    for node in module.tree.body:
        if len("\n".join(module.lines[: node.end_lineno])) > high:
            break
        end = node.end_lineno
    text = "\n".join(module.lines[:end]) + "\n"
    return text if len(text) >= low else None


def _summarization(module: Module, index: int) -> str | None:
    doc = ast.get_docstring(module.tree)
    if not doc or len(doc) < 150:
        return None
    text = _opening(module, 2000, 5000)
    if text is None:
        return None
    return (
        f"Below is the beginning of the Python standard library module `{module.name}`.\n\n"
        f"{FENCE}python\n{text}{FENCE}\n\n{SUMMARY_ASKS[index % len(SUMMARY_ASKS)]}"
    )


# -- qa ---------------------------------------------------------------------------------------


def _neighbourhood(module: Module, node: ast.AST, high: int = 5000) -> str | None:
    """Consecutive top-level statements around ``node``'s own, up to ``high`` characters."""
    body = module.tree.body
    holder = next(i for i, n in enumerate(body) if n.lineno <= node.lineno <= n.end_lineno)
    first = last = holder

    def size(a: int, b: int) -> int:
        return len("\n".join(module.lines[body[a].lineno - 1 : body[b].end_lineno]))

    if size(first, last) > high:
        return None
    while size(first, last) < 2000:
        grown = False
        if last + 1 < len(body) and size(first, last + 1) <= high:
            last, grown = last + 1, True
        if first > 0 and size(first - 1, last) <= high:
            first, grown = first - 1, True
        if not grown:
            break
    return "\n".join(module.lines[body[first].lineno - 1 : body[last].end_lineno]) + "\n"


def _question(name: str, function: ast.FunctionDef, kind: int) -> str | None:
    if kind == 0:  # a default value
        args = function.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        pairs = [(a, d) for a, d in pairs if a.arg not in ("self", "cls")]
        if not pairs:
            return None
        return f"What is the default value of the parameter `{pairs[-1][0].arg}` of `{name}`?"
    raised = [n for n in ast.walk(function) if isinstance(n, ast.Raise) and n.exc is not None]
    if not raised:
        return None
    return f"Which exception does `{name}` raise, and in which case?"


def _qa(module: Module, index: int) -> str | None:
    for name, function in _functions(module):
        question = _question(name, function, index % 2)
        context = question and _neighbourhood(module, function)
        if not context or len(context) < 1500:
            continue
        return (
            "Read the following code and answer the question. Answer with a short phrase "
            f"taken from the code.\n\nModule: {module.name}\n\n{FENCE}python\n{context}{FENCE}"
            f"\n\nQuestion: {question}"
        )
    return None


# -- chat -------------------------------------------------------------------------------------

REWRITES = (
    "Rewrite your previous answer as a bulleted list.",
    "Rewrite your answer for a beginner, in simpler words.",
    "Rewrite your answer in at most three sentences.",
    "Rewrite your answer in a more formal tone, and end it with an example call.",
)


def _chat(module: Module, index: int) -> list[dict] | None:
    for name, function in _functions(module):
        doc = ast.get_docstring(function)
        if not doc or len(doc) < 300 or len(doc) > 2500:
            continue
        code = _segment(module, function, drop_docstring=True)
        if not _fits(code, 200, 3000):
            continue
        return [
            {
                "role": "user",
                "content": f"What does `{name}` of Python's "
                f"`{module.name}` module do?\n\n{FENCE}python\n{code}{FENCE}",
            },
            {"role": "assistant", "content": f"Here is what `{name}` does.\n\n{doc}"},
            {"role": "user", "content": REWRITES[index % len(REWRITES)]},
        ]
    return None


BUILDERS = {"code_edit": _code_edit, "summarization": _summarization, "qa": _qa, "chat": _chat}


def _task_rows(task: str, count: int) -> list[BenchRow]:
    rows: list[BenchRow] = []
    if task == "open_ended":
        for prompt in OPEN_ENDED[:count]:
            row_id = f"open-{len(rows):02d}"
            messages = [{"role": "user", "content": prompt}]
            rows.append(BenchRow(task, row_id, messages, source=f"built-in suite {row_id}"))
        return rows
    for module in _modules(task):
        if len(rows) >= count:
            break
        made = BUILDERS[task](module, len(rows))
        if made is None:
            continue
        messages = made if isinstance(made, list) else [{"role": "user", "content": made}]
        row_id = f"{task}-{len(rows):02d}"
        source = f"built-in suite {row_id} (module {module.name})"
        rows.append(BenchRow(task, row_id, messages, source=source))
    return rows


def suite_rows(limit: int | None = None, tasks=TASKS) -> list[BenchRow]:
    """The suite's prompts: ``limit`` per task (:data:`DEFAULT_PER_TASK` when None; fewer where
    the material runs out), tasks in :data:`TASKS` order. The first N of a larger ``limit``
    are the N of a smaller one."""
    count = DEFAULT_PER_TASK if limit is None else limit
    return [row for task in tasks for row in _task_rows(task, count)]


def suite_fingerprint(rows) -> str:
    """A short hash of the prompts' ids and messages: two runs with the same fingerprint ran
    the very same requests."""
    text = json.dumps([[r.task, r.id, r.messages] for r in rows], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
