"""Tool calls through the model's own chat template, where it supports tools in the Hermes
format (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro and 3):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The template is not parsed: :func:`detect` renders a probe conversation (one tool, an
assistant's two calls) and reads the format off the result, as llama.cpp's server learns a
template's capabilities by rendering it: the text around each call (``<tool_call>`` and a
newline, say) and between two calls. A template that lists no tools, or writes calls some
other way, gets None and tools go through the generic format (:mod:`.tools`).

With a :class:`TemplateFormat`, the tools go to the template (``tools=``, in transformers'
shape), and so do the history's assistant ``tool_calls`` (arguments as objects) and ``tool``
messages. The answer is one or more calls (one unless ``parallel_tool_calls``), each call's JSON
enforced by the grammar against its tool's ``parameters`` and laid out as
:data:`~promptlookup.grammar.JSON_LAYOUT`, nothing after the last call; under ``tool_choice``
``"auto"`` also text (without the tag) alone or before the calls, which comes back as
``content``.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..grammar import JSON_LAYOUT, Grammar, engine_tokenizer, prepared_schema
from ..prompts import apply_chat_template
from .reading import read_calls
from .tools import Scan, loads_arguments

if TYPE_CHECKING:
    from .tools import ToolPlan

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "a probe",
        "parameters": {"type": "object", "properties": {"probe_arg": {"type": "integer"}}},
    },
}
_PROBE_MESSAGES = [
    {"role": "user", "content": "probe question"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "probe_tool", "arguments": {"probe_arg": n}}}
            for n in (1, 2)
        ],
    },
]
_CALL = (
    r'\{\s*"name"\s*:\s*"probe_tool"\s*,\s*"arguments"\s*:\s*\{\s*"probe_arg"\s*:\s*%d\s*\}\s*\}'
)
#: Two probe calls as a template renders them: the text around a call, and between two.
_PROBE_CALLS = re.compile(
    f"<tool_call>(\\s*){_CALL % 1}(\\s*)</tool_call>(\\s*)<tool_call>\\s*{_CALL % 2}"
)


@dataclass(frozen=True)
class TemplateFormat:
    """How the template writes calls: ``opening`` + call JSON + ``closing``, consecutive calls
    ``separator`` apart."""

    opening: str = f"{OPEN_TAG}\n"
    closing: str = f"\n{CLOSE_TAG}"
    separator: str = "\n"
    #: The tags' token ids where the tokenizer has each as a token of its own (an added
    #: token, as Qwen's), which the grammar engine matches as that token, never as its text.
    opening_token: int | None = None
    closing_token: int | None = None

    # -- the prompt ---------------------------------------------------------------------------

    def messages(self, messages: list[dict]) -> list[dict]:
        """:mod:`.tools`' plain messages in transformers' shapes for a template: an assistant's
        ``tool_calls`` as ``{"id", "type", "function": {"name", "arguments"}}`` (arguments an
        object where they parse), a tool message with its call's ``name``."""
        names = {call["id"]: call["name"] for m in messages for call in m.get("tool_calls") or ()}
        out = []
        for message in messages:
            rendered = {"role": message["role"], "content": message.get("content") or ""}
            if message.get("tool_calls"):
                rendered["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": loads_arguments(call["arguments"]),
                        },
                    }
                    for call in message["tool_calls"]
                ]
            if message["role"] == "tool":
                ident = message.get("tool_call_id")
                rendered.update(tool_call_id=ident, name=names.get(ident, ""))
            out.append(rendered)
        return out

    @staticmethod
    def tools(plan: ToolPlan) -> list[dict]:
        """The plan's tools as a template takes them (OpenAI's shape)."""
        return [{"type": "function", "function": tool} for tool in plan.tools]

    # -- the answer ---------------------------------------------------------------------------

    def grammar(self, plan: ToolPlan) -> Grammar:
        """The answer's grammar (see the module doc)."""
        calls, defs = plan.call_schemas()
        call_json = _json({"anyOf": calls, "$defs": defs})
        closing = _tagged(self.closing, CLOSE_TAG, self.closing_token)
        more = f" ({_literal(self.separator)} call)*" if plan.parallel else ""
        opening = _tagged(self.opening, OPEN_TAG, self.opening_token)
        rules = [f"call: {opening} {call_json} {closing}", f"calls: call{more}"]
        if plan.choice != "auto":
            return _lark(["start: calls", *rules])
        if plan.answer is not None:  # a response format: its JSON, or calls
            return _lark(["start: answer | calls", f"answer: {_json(plan.answer)}", *rules])
        # Text without the tag that does not end in a beginning of it (a reader holds those
        # back), alone or before the calls.
        beginnings = "|".join(_regex(OPEN_TAG[:n]) for n in range(1, len(OPEN_TAG)))
        tag = _regex(OPEN_TAG)
        rules.append(f"TEXT: /(?s:.+)/ & ~/(?s:.*{tag}.*)/ & ~/(?s:.*({beginnings}))/")
        if self.opening_token is not None:  # a token of its own, never in text
            return _lark(["start: TEXT | TEXT? calls", *rules])
        # The text ends where the tag comes (the engine's lexer does not split text before a
        # tag it has taken in), the first call's rest then follows.
        after = self.opening[len(OPEN_TAG) :]
        first = f"{_literal(after)} " if after else ""
        return _lark(
            [
                "start: TEXT | before first",
                *rules,
                f"before[stop={_literal(OPEN_TAG)}]: /(?s:.*)/",
                f"first: {first}{call_json} {closing}{more}",
            ]
        )

    def scan(self, text: str) -> Scan:
        """Read a (partial) answer (:class:`.tools.Scan`): its text up to the first call, less
        an end that may begin the tag, and its calls."""
        start = text.find(OPEN_TAG)
        if start < 0:
            held = next(
                (n for n in range(len(OPEN_TAG) - 1, 0, -1) if text.endswith(OPEN_TAG[:n])), 0
            )
            return Scan(content=text[: len(text) - held])
        calls = []
        if text.startswith(self.opening, start):
            between = f"}}{self.closing}{self.separator}{self.opening}"
            calls = read_calls(text, start + len(self.opening), between)
        return Scan(content=text[:start], calls=calls)

    def complete(self, text: str) -> bool:
        """Whether ``text`` is a whole answer the grammar accepted (not cut at a length)."""
        if OPEN_TAG not in text:
            return True
        found = self.scan(text)
        return (
            bool(found.calls)
            and all(done for _, _, done in found.calls)
            and text.endswith(f"}}{self.closing}")
        )


def _json(schema: dict) -> str:
    """``schema`` as a Lark rule's body: closed and checked as any JSON schema
    (:func:`~promptlookup.grammar.prepared_schema`), laid out as :data:`JSON_LAYOUT`."""
    return f"%json {json.dumps({**prepared_schema(schema), 'x-guidance': JSON_LAYOUT})}"


def _lark(rules: list[str]) -> Grammar:
    return Grammar.lark("\n".join(rules) + "\n")


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal


def _tagged(text: str, tag: str, token: int | None) -> str:
    """``text``, which holds ``tag``, as Lark: the tag as its token where it has one."""
    if token is None:
        return _literal(text)
    before, after = text.split(tag, 1)
    parts = [_literal(before) if before else "", f"<[{token}]>", _literal(after) if after else ""]
    return " ".join(part for part in parts if part)


def _regex(text: str) -> str:
    """``text`` as a Lark regular expression that matches it alone."""
    return "".join(c if c.isalnum() or c == "_" else f"\\x{{{ord(c):x}}}" for c in text)


#: Each tokenizer's format, found once (:func:`detect`).
_DETECTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def detect(tokenizer, eos_token_ids: Sequence[int] = ()) -> TemplateFormat | None:
    """The Hermes format as ``tokenizer``'s chat template writes tool calls, or None where it
    does not (no template, a template without tools, another format, or a tag the tokenizer
    decodes away as a special token). ``eos_token_ids``: the model's, for the grammar engine's
    view of the tokenizer (:func:`~promptlookup.grammar.engine_tokenizer`)."""
    try:
        return _DETECTED[tokenizer]
    except (KeyError, TypeError):
        pass
    found = _detect(tokenizer, eos_token_ids)
    try:
        _DETECTED[tokenizer] = found
    except TypeError:  # not weakly referable: found again next time
        pass
    return found


def _detect(tokenizer, eos_token_ids: Sequence[int]) -> TemplateFormat | None:
    template = getattr(tokenizer, "chat_template", None)
    if not template or "tool" not in str(template) or not hasattr(tokenizer, "apply_chat_template"):
        return None
    try:
        rendered = apply_chat_template(
            tokenizer, _PROBE_MESSAGES, tools=[_PROBE_TOOL], tokenize=False,
            add_generation_prompt=False,
        )  # fmt: skip
    except Exception:  # a template that cannot render the probe: it does not take tools
        return None
    match = _PROBE_CALLS.search(rendered if isinstance(rendered, str) else "")
    if match is None or "a probe" not in rendered[: match.start()]:
        return None
    special = getattr(tokenizer, "all_special_tokens", ())
    if OPEN_TAG in special or CLOSE_TAG in special:
        return None
    opening, closing, separator = match.groups()
    tokens = [_tag_token(tokenizer, eos_token_ids, tag) for tag in (OPEN_TAG, CLOSE_TAG)]
    return TemplateFormat(OPEN_TAG + opening, closing + CLOSE_TAG, separator, *tokens)


def _tag_token(tokenizer, eos_token_ids: Sequence[int], tag: str) -> int | None:
    """``tag``'s token id where the tokenizer has it as one token that the grammar engine
    treats as a token of its own (an added token of a Hugging Face tokenizer)."""
    ids = list(tokenizer(tag, add_special_tokens=False)["input_ids"])
    if len(ids) != 1:
        return None
    eos = list(eos_token_ids) or [tokenizer.eos_token_id]
    return ids[0] if engine_tokenizer(tokenizer, eos).is_special_token(ids[0]) else None


def encode(lm, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The prompt's token ids: ``messages`` through ``lm``'s chat template, with ``tools``."""
    if tools is None:
        return lm.encode(messages)
    return apply_chat_template(lm.tokenizer, messages, tools=tools)
