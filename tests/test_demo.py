"""``make demo``: its request (a function with one broken line, read from the standard library),
its check of the answer (the code parses, is the function with that line fixed and nothing else
changed, and answers the test calls right), and its verdict (identical, or where the outputs
part and both tokens' logits)."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from promptlookup.demo import REQUEST, check_answer, compare


def answer(code: str) -> str:
    return f"Here is the fixed function:\n\n```python\n{code}```\n\nThe bug is fixed."


def test_the_request_holds_the_broken_function_and_both_lines():
    request = REQUEST.request
    assert REQUEST.broken in request and REQUEST.source not in request
    assert f"`{REQUEST.bug}` should be `{REQUEST.fix}`" in request
    assert REQUEST.broken.count(REQUEST.bug) == 1 and REQUEST.fix not in REQUEST.broken
    assert ast.dump(ast.parse(REQUEST.broken)) != ast.dump(ast.parse(REQUEST.source))


def test_the_test_calls_tell_the_fixed_function_from_the_broken_one():
    namespace = dict(vars(__import__(REQUEST.function.__module__)))
    exec(REQUEST.broken, namespace)
    broken = namespace[REQUEST.name]
    for arguments, want in REQUEST.calls:
        assert REQUEST.function(*arguments) == want
        assert broken(*arguments) != want


def test_a_right_answer_passes_the_check():
    right, found = check_answer(answer(REQUEST.source))
    assert right, found
    assert found.startswith("the code parses and defines has_magic, is the given function with")
    assert "`return match is None` made `return match is not None`" in found
    assert "has_magic('*.py') -> True" in found and "has_magic(b'data.bin') -> False" in found


def test_a_right_answer_may_add_a_docstring_and_comments():
    code = REQUEST.source.replace(
        "def has_magic(s):\n", 'def has_magic(s):\n    """Whether s has glob wildcards."""\n'
    ).replace(REQUEST.fix, REQUEST.fix + "  # fixed")
    assert check_answer(answer(code))[0]


FIXED_BUT_REWRITTEN = (
    "def has_magic(s):\n"
    "    if isinstance(s, bytes):\n"
    "        return magic_check_bytes.search(s) is not None\n"
    "    return magic_check.search(s) is not None\n"
)


@pytest.mark.parametrize(
    "text, message",
    [
        ("I would fix it.", "no complete Python code block"),
        (answer("def has_magic(s:\n"), "does not parse (line 1"),
        (answer(REQUEST.broken), "still has the bug: `return match is None`"),
        (answer("def is_magic(s):\n    return True\n"), "but defines is_magic, not has_magic"),
        (
            answer(FIXED_BUT_REWRITTEN),
            "changes more than the broken line: its line 3 (as ast.unparse writes it) is "
            "`return magic_check_bytes.search(s) is not None`",
        ),
        (
            answer(REQUEST.source.replace("magic_check.search", "magic_check.match")),
            "changes more than the broken line",
        ),
        (
            answer(REQUEST.source.replace("    return match is not None\n", "")),
            "where the fixed function has `return match is not None`",
        ),
    ],
)
def test_wrong_answers_fail_the_check_and_say_why(text, message):
    right, found = check_answer(text)
    assert not right and message in found, found


def test_only_the_first_code_block_counts():
    text = answer(REQUEST.broken) + "\n\n```python\n" + REQUEST.source + "```\n"
    assert not check_answer(text)[0]


def test_outputs_that_part_are_named_by_position_and_logits(tiny_lm):
    plain = SimpleNamespace(token_ids=[3, 4, 5, 6], prompt_ids=[1, 2, 3])
    assert compare(tiny_lm, SimpleNamespace(token_ids=[3, 4, 5, 6]), plain) == "identical"
    verdict = compare(tiny_lm, SimpleNamespace(token_ids=[3, 4, 9, 6]), plain)
    assert verdict.startswith("different from new token 2 on: prompt lookup chose 9 (logit ")
    assert "plain decoding 5 (logit " in verdict and "bug" not in verdict
    assert (
        compare(tiny_lm, SimpleNamespace(token_ids=[3, 4]), plain)
        == "different: one output stops at token 2, the other goes on"
    )


@pytest.mark.slow
def test_the_default_model_answers_the_demo_right(default_lm):
    from promptlookup.demo import MAX_NEW_TOKENS

    result = default_lm.generate(REQUEST.request, chat=True, max_new_tokens=MAX_NEW_TOKENS)
    right, found = check_answer(result.text)
    assert right, found
