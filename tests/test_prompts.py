"""Prompts as token ids (:mod:`promptlookup.prompts`): one caller of a tokenizer's chat
template, and a model without one told once, left as it was."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from types import SimpleNamespace

from conftest import TinyTokenizer

from promptlookup.prompts import apply_chat_template, encode_prompt

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "promptlookup"


class TemplateTokenizer(TinyTokenizer):
    """A tokenizer with a chat template that renders each message as ``role: content``."""

    chat_template = "{{ role: content }}"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **options):
        text = " ".join(f"{m['role']}: {m['content']}" for m in messages)
        text += " tools" * bool(options.get("tools")) + " assistant:" * add_generation_prompt
        return {"input_ids": self(text)["input_ids"]} if tokenize else text


def test_only_prompts_calls_a_tokenizers_chat_template():
    callers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "apply_chat_template"
    )
    assert callers == ["prompts.py"]


def test_the_chat_template_gives_ids_or_text_with_or_without_tools():
    tokenizer = TemplateTokenizer(32)
    messages = [{"role": "user", "content": "hi"}]
    assert apply_chat_template(tokenizer, messages, tokenize=False) == "user: hi assistant:"
    text = apply_chat_template(tokenizer, messages, tools=[{}], add_generation_prompt=False,
                               tokenize=False)  # fmt: skip
    assert text == "user: hi tools"
    ids = apply_chat_template(tokenizer, messages)  # a mapping's input_ids, as a list
    assert ids == tokenizer("user: hi assistant:")["input_ids"]
    lm = SimpleNamespace(tokenizer=tokenizer, name="templated")
    assert encode_prompt(lm, messages) == ids == encode_prompt(lm, "hi", chat=True)


def test_a_model_without_a_template_is_told_once_and_left_as_it_was():
    lm = SimpleNamespace(tokenizer=TinyTokenizer(32), name="bare")
    before = dict(vars(lm))
    messages = [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = [encode_prompt(lm, messages) for _ in range(3)]
    assert ids == [encode_prompt(lm, "ab\n\nc")] * 3
    assert [str(w.message) for w in caught] == [
        "bare has no chat template (a base model?): the messages' contents are joined as plain text"
    ]
    assert vars(lm) == before  # nothing planted on the model
