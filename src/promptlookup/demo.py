"""``make demo``: a bug-fixing request about a short function, answered by the default model with
prompt lookup (streamed), checked, then answered by plain decoding, with both speeds and
whether the two outputs are identical.

The request shows :func:`glob.has_magic` (its source, read with :mod:`inspect`) with one line
broken, ``return match is None`` for ``return match is not None``, says which line is wrong and
how it should read, and asks for the whole fixed function: most of the answer copies the prompt,
which is where prompt lookup saves forward passes. The check reads the answer's first Python
code block: it must parse (:mod:`ast`), define ``has_magic`` and be the original function
(docstrings aside) with that one line fixed; only then is the function run, on four test calls
whose answers the broken line gets wrong. The prose after the code block is not checked. The
demo prints what the check found.

The request was chosen because the default model (SmolLM2-135M-Instruct, greedy) answers it
right both in its own Q4_1 weights and dequantized to float32, and answers rephrasings of it
right too, so small numeric changes are unlikely to flip it. A model this small does not answer
every edit right (it rewrote the body or kept the bug in most of the other one-line fixes tried,
on standard-library and promptlookup functions), and the check says so when it does not.
"""

from __future__ import annotations

import ast
import glob
import inspect
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import promptlookup
from promptlookup.bench.agreed import agreed_length

MAX_NEW_TOKENS = 200
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


@dataclass(frozen=True)
class BugFix:
    """``function`` shown with its line ``fix`` written as ``bug``; the answer should restore it.
    ``calls`` are test calls ``(arguments, right result)`` that the broken line gets wrong."""

    function: Callable
    fix: str
    bug: str
    calls: tuple[tuple[tuple, object], ...]
    where: str

    @property
    def name(self) -> str:
        return self.function.__name__

    @property
    def source(self) -> str:
        """The function as it should be (read from its module, so nothing is copied here)."""
        source = textwrap.dedent(inspect.getsource(self.function))
        if source.count(self.fix) != 1:
            raise ValueError(f"{self.name}'s source does not hold `{self.fix}` exactly once")
        return source

    @property
    def broken(self) -> str:
        return self.source.replace(self.fix, self.bug)

    @property
    def request(self) -> str:
        return (
            f"Here is a Python function from {self.where}:\n\n```python\n{self.broken}```\n\n"
            f"It has a bug: `{self.bug}` should be `{self.fix}`. Fix it, changing nothing else. "
            "Reply with the complete fixed function in a Python code block."
        )


REQUEST = BugFix(
    glob.has_magic,
    "return match is not None",
    "return match is None",
    calls=(
        (("*.py",), True),
        (("notes.txt",), False),
        ((b"data[0-9].bin",), True),
        ((b"data.bin",), False),
    ),
    where="Python's glob module",
)


def _lines(function: ast.FunctionDef) -> list[str]:
    """The function's code as :func:`ast.unparse` writes it, without its docstring: layout,
    comments and docstrings aside, two functions are the same when these lines are."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:] or [ast.Pass()]
    return ast.unparse(function).splitlines()


def _call(name: str, arguments: tuple) -> str:
    return f"{name}({', '.join(map(repr, arguments))})"


def check_answer(text: str, fix: BugFix = REQUEST) -> tuple[bool, str]:
    """``(right, what was found)`` for an answer to ``fix``'s request: its first Python code
    block must parse, define the function, and be the original function with the broken line
    fixed and nothing else changed (docstrings, comments and layout aside); the function it
    defines is then run on ``fix.calls`` and must return each right result.

    >>> import calendar
    >>> leap = BugFix(calendar.isleap, "year % 4 == 0 and", "year % 4 == 0 or",
    ...               (((1900,), False), ((2024,), True)), "the calendar module")
    >>> check_answer("```python\\n" + leap.source + "```", leap)[0]
    True
    >>> check_answer("```python\\n" + leap.broken + "```", leap)[1]
    'the code parses and defines isleap, but still has the bug: `year % 4 == 0 or`'
    """
    match = CODE_BLOCK.search(text)
    if match is None:
        return False, "the answer has no complete Python code block"
    code = match.group(1)
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return False, f"the answer's code does not parse (line {exc.lineno}: {exc.msg})"
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    mine = next((n for n in defined if n.name == fix.name), None)
    if mine is None:
        names = ", ".join(n.name for n in defined) or "no function"
        return False, f"the code parses but defines {names}, not {fix.name}"
    found = f"the code parses and defines {fix.name}"
    lines = _lines(mine)
    if lines == _lines(ast.parse(fix.broken).body[0]):
        return False, f"{found}, but still has the bug: `{fix.bug}`"
    right = _lines(ast.parse(fix.source).body[0])
    if lines != right:
        at = next(
            (i for i, (a, b) in enumerate(zip(lines, right, strict=False)) if a != b),
            min(len(lines), len(right)),
        )
        theirs = f"`{lines[at].strip()}`" if at < len(lines) else "nothing"
        ours = f"`{right[at].strip()}`" if at < len(right) else "nothing"
        return False, (
            f"{found}, but changes more than the broken line: its line {at + 1} (as "
            f"ast.unparse writes it) is {theirs} where the fixed function has {ours}"
        )
    # Only the function's definition runs (not the rest of the block), in its module's globals.
    namespace = dict(vars(inspect.getmodule(fix.function)))
    exec(compile(ast.Module([mine], type_ignores=[]), "<answer>", "exec"), namespace)
    function = namespace[fix.name]
    results = [(arguments, function(*arguments), want) for arguments, want in fix.calls]
    shown = ", ".join(f"{_call(fix.name, a)} -> {got!r}" for a, got, _ in results)
    wrong = [(a, got, want) for a, got, want in results if got != want]
    if wrong:
        a, got, want = wrong[0]
        return False, f"{found}, but {_call(fix.name, a)} returns {got!r}, not {want!r}"
    return True, (
        f"{found}, is the given function with `{fix.bug}` made `{fix.fix}` and nothing else "
        f"changed, and answers {len(results)} test calls right: {shown}"
    )


def main() -> None:
    print(
        "Loading the default model (SmolLM2-135M-Instruct; the first run reads its GGUF's "
        "tokenizer and compiles the kernels once, ~20 s)...",
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
