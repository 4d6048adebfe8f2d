"""``make demo``: a code-editing request about one of promptlookup's own functions, answered by
the default model with prompt lookup (streamed), checked, then answered by plain decoding, with
both speeds and whether the two outputs are identical.

The request renames one parameter. The check reads the answer's first Python code block: it
must parse (:mod:`ast`), name the new identifier and no longer the old one, and define the same
function; the demo prints what it found. The request was chosen because the default model
(SmolLM2-135M-Instruct, greedy) answers it right; a small model does not answer every edit
right, and the check says so when it does not.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass

import promptlookup
from promptlookup.bench import methods as bench_methods
from promptlookup.bench.agreed import agreed_length

MAX_NEW_TOKENS = 200
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


@dataclass(frozen=True)
class Rename:
    """Rename identifier ``old`` (a ``what``: parameter, variable, or the function itself) to
    ``new`` in ``source``, the source of function ``name``."""

    name: str
    source: str
    old: str
    new: str
    what: str = "parameter"

    @property
    def request(self) -> str:
        return (
            "Here is a Python function from my project:\n\n```python\n" + self.source + "```\n\n"
            f"Rename the {self.what} `{self.old}` to `{self.new}`, changing nothing else. "
            "Reply with the complete updated function in a Python code block."
        )


REQUEST = Rename(
    "cut_after_eos", inspect.getsource(bench_methods.cut_after_eos), "eos_token_ids", "stop_ids"
)


def identifiers(tree: ast.AST) -> list[str]:
    """Every identifier a tree names: variables, attributes, parameters, keywords, definitions.

    >>> sorted(set(identifiers(ast.parse("def f(a, *, b=1):\\n    return g(a).c + b"))))
    ['a', 'b', 'c', 'f', 'g']
    """
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
    return names


class _Renamer(ast.NodeTransformer):
    """Renames identifier ``old`` to ``new`` wherever a tree names it."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node):
        node.id = self.new if node.id == self.old else node.id
        return node

    def visit_arg(self, node):
        node.arg = self.new if node.arg == self.old else node.arg
        return self.generic_visit(node)

    def visit_Attribute(self, node):
        node.attr = self.new if node.attr == self.old else node.attr
        return self.generic_visit(node)

    def visit_keyword(self, node):
        node.arg = self.new if node.arg == self.old else node.arg
        return self.generic_visit(node)


def _shape(function: ast.FunctionDef, rename: tuple[str, str] | None = None) -> str:
    """The function's syntax tree without its docstring, identifiers renamed by ``rename``."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:] or [ast.Pass()]
    if rename:
        function = _Renamer(*rename).visit(function)
    return ast.dump(function)


def check_answer(text: str, rename: Rename = REQUEST) -> tuple[bool, str]:
    """``(right, what was found)`` for an answer to ``rename``'s request: its first Python code
    block must parse, define the function, name the new identifier and not the old one, and
    be the original function but for the name (docstrings aside: they may say the new name).

    >>> edit = Rename("double", "def double(old):\\n    return old * 2\\n", "old", "new")
    >>> check_answer("```python\\ndef double(new):\\n    return new * 2\\n```", edit)[0]
    True
    >>> check_answer("```python\\ndef double(new):\\n    return new + new\\n```", edit)[1]
    'the code parses and names `new` 3 times and `old` nowhere, but changes more than the name'
    """
    match = CODE_BLOCK.search(text)
    if match is None:
        return False, "the answer has no complete Python code block"
    try:
        tree = ast.parse(match.group(1))
    except SyntaxError as exc:
        return False, f"the answer's code does not parse (line {exc.lineno}: {exc.msg})"
    expected = rename.new if rename.old == rename.name else rename.name
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    mine = next((n for n in defined if n.name == expected), None)
    if mine is None:
        names = ", ".join(n.name for n in defined) or "no function"
        return False, f"the code parses but defines {names}, not {expected}"
    names = identifiers(mine)
    found = f"names `{rename.new}` {names.count(rename.new)} times and `{rename.old}` " + (
        f"{names.count(rename.old)} times" if rename.old in names else "nowhere"
    )
    if rename.new not in names or rename.old in names:
        return False, f"the code parses and defines {expected}, but {found}"
    original = ast.parse(textwrap.dedent(rename.source)).body[0]
    if _shape(mine, (rename.new, rename.old)) != _shape(original):
        return False, f"the code parses and {found}, but changes more than the name"
    return True, (
        f"the code parses, defines {expected}, {found}, and is the original but for the name"
    )


def main() -> None:
    print(
        "Loading the default model (SmolLM2-135M-Instruct; the first run converts its GGUF "
        "file once, ~20 s)...",
        file=sys.stderr,
    )
    lm = promptlookup.load_model()
    print(
        "Measuring this machine's forward-pass costs (the first run only: up to ~30 s)...",
        file=sys.stderr,
    )
    lm.warm_up()
    request = REQUEST.request
    print(f"\n### Request\n{request}\n\n### Answer (streamed, prompt lookup)\n", flush=True)
    stream = lm.stream(request, chat=True, max_new_tokens=MAX_NEW_TOKENS)
    for piece in stream:
        print(piece, end="", flush=True)
    fast = stream.result
    right, found = check_answer(fast.text)
    print(f"\n\ncheck: {'right' if right else 'WRONG'}: {found}")
    print("\n### Plain decoding of the same request (not shown)...", flush=True)
    plain = lm.generate(request, chat=True, max_new_tokens=MAX_NEW_TOKENS, drafter="none")
    fs, ps = fast.stats, plain.stats
    print(
        f"\nprompt lookup : {fs.new_tokens} tokens in {fs.seconds:.2f} s = "
        f"{fs.tokens_per_second:.1f} tokens/s, {fs.tokens_per_forward:.2f} tokens per forward pass"
    )
    print(
        f"plain decoding: {ps.new_tokens} tokens in {ps.seconds:.2f} s = "
        f"{ps.tokens_per_second:.1f} tokens/s, 1.00 tokens per forward pass"
    )
    speedup = fs.tokens_per_second / ps.tokens_per_second if ps.tokens_per_second else float("nan")
    print(f"speed-up: {speedup:.2f}x; outputs {compare(lm, fast, plain)}")


def compare(lm, fast, plain) -> str:
    """``identical``, or where the two outputs part and the two tokens' logits there (from a
    one-token pass after the common prefix: a near-tie where passes are not row-invariant)."""
    if fast.token_ids == plain.token_ids:
        return "identical"
    position = agreed_length([fast.token_ids, plain.token_ids])
    if position >= min(len(fast.token_ids), len(plain.token_ids)):
        return f"different: one output stops at token {position}, the other goes on"
    target = lm.target
    target.reset()
    context = [*plain.prompt_ids, *plain.token_ids[:position]]
    target.prefill(context[:-1])
    logits = target.forward(context[-1:])[0]
    ours, theirs = fast.token_ids[position], plain.token_ids[position]
    invariant = getattr(target, "row_invariant", False)
    return (
        f"different from new token {position} on: prompt lookup chose {ours} (logit "
        f"{logits[ours].item():.6f}), plain decoding {theirs} (logit {logits[theirs].item():.6f})"
        + (
            ""
            if invariant
            else "; this model's passes are not row-invariant, so a near-tie can part them"
        )
    )


if __name__ == "__main__":
    main()
