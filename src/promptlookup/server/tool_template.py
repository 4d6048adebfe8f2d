"""Tool calls through the model's own chat template, where it supports tools in the Hermes
format (Qwen2.5, Qwen3, Hermes, SmolLM3 and others):

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
messages. The answer is either text, which must not begin with the opening tag (``tool_choice``
``"auto"`` only), or one or more calls (one unless ``parallel_tool_calls``), each call's JSON
enforced by the grammar against its tool's ``parameters`` and laid out as
:data:`~promptlookup.grammar.JSON_LAYOUT`, nothing after the last call.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..grammar import JSON_LAYOUT, Grammar, engine_tokenizer
from .tools import Scan, loads_arguments, read_calls

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
        call_schema = {"x-guidance": JSON_LAYOUT, "anyOf": plan.call_schemas()}
        opening = _tagged(self.opening, OPEN_TAG, self.opening_token)
        closing = _tagged(self.closing, CLOSE_TAG, self.closing_token)
        call = f"{opening} %json {json.dumps(call_schema)} {closing}"
        many = f"({_literal(self.separator)} call)*" if plan.parallel else ""
        rules = [f"calls: call {many}", f"call: {call}"]
        if plan.choice == "auto":
            # Text that is not a call, nor a beginning of one.
            beginnings = "|".join(_regex(self.opening[:n]) for n in range(1, len(self.opening)))
            text = f"/(?s:.+)/ & ~/{_regex(self.opening)}(?s:.*)/ & ~/({beginnings})/"
            rules = ["start: TEXT | calls", f"TEXT: {text}", *rules]
        else:
            rules = ["start: calls", *rules]
        return Grammar.lark("\n".join(rules) + "\n")

    def scan(self, text: str) -> Scan:
        """Read a (partial) answer (:class:`.tools.Scan`): text once it cannot be a call."""
        if text.startswith(self.opening):
            between = f"}}{self.closing}{self.separator}{self.opening}"
            return Scan(calls=read_calls(text, len(self.opening), between))
        if self.opening.startswith(text):
            return Scan()  # not decided yet
        return Scan(content=text)

    def complete(self, text: str) -> bool:
        """Whether ``text`` is a whole answer the grammar accepted (not cut at a length)."""
        if not text.startswith(self.opening):
            return True
        found = self.scan(text)
        return (
            bool(found.calls)
            and all(done for _, _, done in found.calls)
            and (text.endswith(f"}}{self.closing}"))
        )


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
        rendered = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=False
        )
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
    ids = lm.tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
