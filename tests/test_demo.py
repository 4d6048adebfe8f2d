"""``make demo``: its check of the answer (the edited code parses, renames, defines the same
function) and its verdict (identical, or where the outputs part and both tokens' logits)."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from promptlookup.demo import REQUEST, check_answer, compare


def answer(code: str) -> str:
    return f"Here is the updated function:\n\n```python\n{code}```\n\nI renamed it."


def test_the_request_holds_the_function_and_names_both_identifiers():
    request = REQUEST.request
    assert REQUEST.source in request and f"`{REQUEST.old}`" in request
    assert f"`{REQUEST.new}`" in request and REQUEST.old in REQUEST.source
    ast.parse(REQUEST.source)


def test_a_right_answer_passes_the_check():
    renamed = REQUEST.source.replace(REQUEST.old, REQUEST.new)
    right, found = check_answer(answer(renamed))
    assert right, found
    assert found.startswith(f"the code parses, defines {REQUEST.name}, names")
    assert found.endswith("and is the original but for the name")
    assert f"`{REQUEST.old}` nowhere" in found


@pytest.mark.parametrize(
    "text, message",
    [
        ("I would rename it.", "no complete Python code block"),
        (answer("def cut_after_eos(:\n"), "does not parse (line 1"),
        (answer(REQUEST.source), "but names `stop_ids` 0 times and `eos_token_ids` 2 times"),
        (answer("def other(stop_ids):\n    return stop_ids\n"), "but defines other, not cut_"),
        (
            answer(
                "def cut_after_eos(token_ids, stop_ids):\n"
                "    return [t for t in token_ids if t in stop_ids]\n"
            ),
            "but changes more than the name",
        ),
    ],
)
def test_wrong_answers_fail_the_check_and_say_why(text, message):
    right, found = check_answer(text)
    assert not right and message in found


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
@pytest.mark.xfail(
    reason="no rename request found that SmolLM2-135M in its Q4_1 weights answers right under "
    "the strict check (it rewrites bodies or skips the rename); the demo prints WRONG until one is",
    strict=False,
)
def test_the_default_model_answers_the_demo_right(default_lm):
    from promptlookup.demo import MAX_NEW_TOKENS

    result = default_lm.generate(REQUEST.request, chat=True, max_new_tokens=MAX_NEW_TOKENS)
    right, found = check_answer(result.text)
    assert right, found
