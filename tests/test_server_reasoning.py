"""Thinking models' reasoning apart from their answer (:mod:`promptlookup.server.reasoning`):
the splitter over streamed deltas agrees with the whole text's split for every way of cutting
it (markers cut anywhere), the markers are read off the chat template; and through the server
on a tiny model with a thinking template (two: one that reads ``reasoning_content``, one that
does not), chat's ``reasoning_content``, Anthropic's ``thinking`` blocks and Responses
``reasoning`` items, whole and streamed, and earlier reasoning sent back in each API's shape
starting the next turn's prompt with the tokens generated."""

from __future__ import annotations

from types import SimpleNamespace

import anthropic
import pytest
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from _server import FIXED, RunningServer
from conftest import tiny_llama
from hypothesis import given
from hypothesis import strategies as st
from test_server_tool_template import TemplateTokenizer

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel
from promptlookup.server import ServerSettings, create_app
from promptlookup.server.anthropic.protocol import MessagesRequest
from promptlookup.server.openai.protocol import ChatCompletionRequest
from promptlookup.server.reasoning import (
    ReasoningSplitter,
    ThinkFormat,
    detect,
    for_request,
)
from promptlookup.server.responses.protocol import ResponsesRequest
from promptlookup.server.serving import _encode

FORM = ThinkFormat("<think>", "</think>")
#: Texts made of the markers' pieces, whitespace and a few letters, so that markers (whole,
#: cut or false starts) come often.
PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "\n", " ", "a", "b"])
TEXTS = st.lists(PIECES, max_size=12).map("".join)


def streamed(text: str, cuts: list[int], inside: bool) -> tuple[str, str, bool, bool]:
    """``text`` fed in pieces cut at ``cuts``: (reasoning, answer, whether it had reasoning,
    whether any reasoning came after some answer)."""
    splitter = ReasoningSplitter(FORM, inside)
    reasoning = answer = ""
    late = False
    bounds = [0, *sorted(set(cuts)), len(text)]
    pieces = [splitter.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    for thought, said in [*pieces, splitter.finish()]:
        late = late or bool(thought and answer)
        reasoning, answer = reasoning + thought, answer + said
    return reasoning, answer, splitter.reasoned, late


@given(TEXTS, st.lists(st.integers(0, 80)), st.booleans())
def test_any_cutting_of_the_deltas_splits_as_the_whole_text(text, cuts, inside):
    cuts = [c for c in cuts if c <= len(text)]
    reasoning, answer = FORM.split(text, inside)
    got = streamed(text, cuts, inside)
    assert got == (reasoning or "", answer, reasoning is not None, False)


@given(TEXTS, st.booleans())
def test_the_texts_put_back_between_markers_are_the_text(text, inside):
    """What a client sends back is, markers around the reasoning again, what was generated
    (but whitespace before an opening marker)."""
    reasoning, answer = FORM.split(text, inside)
    if reasoning is None:
        assert answer == text
    elif FORM.close in text:
        start = "" if inside else FORM.open
        assert start + reasoning + FORM.close + answer == (text if inside else text.lstrip())


def test_the_split_of_a_few_answers():
    assert FORM.split("<think>\nhmm\n</think>\n\nHi") == ("\nhmm\n", "\n\nHi")
    assert FORM.split(" \n<think>cut short") == ("cut short", "")
    assert FORM.split("Hi <think>no</think>") == (None, "Hi <think>no</think>")
    assert FORM.split("hmm</think>Hi", inside=True) == ("hmm", "Hi")
    assert FORM.split("", inside=True) == ("", "")
    assert FORM.opened_by("<|Assistant|><think>\n") and not FORM.opened_by("</think>\n\n")


class _Tokenizer:
    def __init__(self, template):
        self.chat_template = template

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_whether_the_prompt_opened_the_thinking_is_read_off_its_last_tokens():
    state = SimpleNamespace(reasoning=FORM, lm=SimpleNamespace(tokenizer=_Tokenizer("")))
    opened = [ord(c) for c in "<|im_start|>assistant\n<think>\n"]
    assert for_request(state, opened).inside
    thinking = for_request(state, [ord(c) for c in "<|im_start|>assistant\n"])
    assert not thinking.inside and thinking.split("<think>a</think>b") == ("a", "b")
    assert for_request(state, opened, SimpleNamespace(reasoning_format="none")) is None
    assert for_request(SimpleNamespace(reasoning=None), opened) is None


def test_the_markers_are_read_off_the_template():
    qwen3 = "{{ '<think>\\n' + message.reasoning_content + '\\n</think>' }}"
    assert detect(_Tokenizer(qwen3)) == ThinkFormat("<think>", "</think>", True)
    r1 = "{% set content = content.split('</think>')[-1] %}"
    assert detect(_Tokenizer(r1)) == ThinkFormat("<think>", "</think>", False)
    assert detect(_Tokenizer({"default": qwen3, "tool_use": "x"})).template_takes_reasoning
    assert detect(_Tokenizer(qwen3), "none") is None
    assert detect(_Tokenizer("{{ messages }}")) is None and detect(object()) is None


def test_earlier_reasoning_goes_where_the_template_takes_it():
    sent = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "b"},
    ]
    rendered = [{"role": "system", "content": "tools"}, *[dict(m) for m in sent]]
    for m in rendered:
        m.pop("reasoning_content", None)
    wrapped = FORM.with_reasoning(sent, rendered)
    assert wrapped[2]["content"] == "<think>r</think>a" and wrapped[4]["content"] == "b"
    keyed = ThinkFormat("<think>", "</think>", True).with_reasoning(sent, rendered)
    assert keyed[2] == {"role": "assistant", "content": "a", "reasoning_content": "r"}
    assert "reasoning_content" not in keyed[4] and keyed[0] == rendered[0]


# The server: a tiny model whose template has thinking markers, all three APIs.

#: A template that reads ``reasoning_content`` itself (Qwen3's manner) and opens the thinking.
KEYED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
    "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
#: A template that knows only the opening marker (the reasoning comes back in the content).
WRAPPED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"
)
#: A template that leaves the opening to the model (Qwen3's manner).
OWN = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>"
    "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Per template: the tiny model's seed and the characters whose tokens are the opening and
#: closing markers, chosen so that its greedy answer to QUESTION closes its reasoning after a
#: few tokens (and, under OWN, opens it first).
MODELS = {
    "keyed": (KEYED, 1, "~", "G"),
    "wrapped": (WRAPPED, 8, "~", "R"),
    "own": (OWN, 17, "0", "I"),
}
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"temperature": 0}
MAX_TOKENS = 40


class ThinkTokenizer(TemplateTokenizer):
    """:class:`TemplateTokenizer` where the markers are one token each: ``<think>`` the
    token of the character ``opening``, ``</think>`` that of ``close`` (characters no prompt
    here has)."""

    def __init__(self, template: str, opening: str, close: str) -> None:
        super().__init__(template)
        self.opening, self.close = opening, close

    def __call__(self, text, add_special_tokens=True):
        text = text.replace("</think>", self.close).replace("<think>", self.opening)
        return super().__call__(text)

    def decode(self, ids, skip_special_tokens=True):
        text = super().decode(ids, skip_special_tokens)
        return text.replace(self.close, "</think>").replace(self.opening, "<think>")


def think_lm(name: str) -> LanguageModel:
    template, seed, opening, close = MODELS[name]
    model = tiny_llama(vocab_size=ThinkTokenizer.vocab_size, seed=seed, context=2048)
    tokenizer = ThinkTokenizer(template, opening, close)
    return LanguageModel(TorchTarget(model), tokenizer, name="tiny", model=model)


@pytest.fixture(scope="module", params=sorted(MODELS))
def server(request):
    lm = think_lm(request.param)
    with RunningServer(create_app(lm, ServerSettings(generation_options=FIXED))) as s:
        yield s


def raw_answer(server):
    """The greedy answer, its text whole (``reasoning_format: "none"``), and that text's
    reasoning and answer: after an opening marker the model wrote, up to the closing one."""
    answer = server.client().chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=MAX_TOKENS,
        extra_body={**GREEDY, "reasoning_format": "none"},
    )  # fmt: skip
    text = answer.choices[0].message.content
    assert "</think>" in text and not text.startswith("</think>"), "the model must think"
    # Under OWN the model opens its thinking; under the others the prompt did.
    assert text.startswith("<think>") == (server.state.lm.tokenizer.chat_template is OWN)
    thought, _, rest = text.removeprefix("<think>").partition("</think>")
    return answer, thought, rest


def test_chat_answers_the_reasoning_apart_whole_and_streamed(server):
    raw, thought, rest = raw_answer(server)
    request = dict(model="tiny", messages=QUESTION, max_tokens=MAX_TOKENS, extra_body=GREEDY)
    whole = server.client().chat.completions.create(**request)
    message = whole.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (thought, rest)
    reasoning, content = "", ""
    for chunk in server.client().chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            assert not (reasoning and content and delta.model_extra.get("reasoning_content"))
            content += delta.content or ""
    assert (reasoning, content) == (thought, rest)
    # Presentation only: the same tokens, the same counts.
    assert whole.usage.completion_tokens == raw.usage.completion_tokens
    assert whole.usage.prompt_tokens == raw.usage.prompt_tokens


def test_anthropic_answers_a_thinking_block_whole_and_streamed(server):
    raw, thought, rest = raw_answer(server)
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    request = dict(model="tiny", max_tokens=MAX_TOKENS, messages=QUESTION, extra_body=GREEDY)
    whole = client.messages.create(**request)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert (whole.content[0].thinking, whole.content[0].signature) == (thought, "")
    assert whole.content[1].text == rest
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    fields = {"type", "thinking", "signature", "text"}
    blocks = [[b.model_dump(include=fields) for b in m.content] for m in (final, whole)]
    assert blocks[0] == blocks[1] and "thinking" in kinds and "signature" in kinds
    assert whole.usage.output_tokens == raw.usage.completion_tokens


def test_responses_answers_a_reasoning_item_whole_and_streamed(server):
    raw, thought, rest = raw_answer(server)
    client, request = server.client(), dict(model="tiny", input="Why is the sky blue?")
    whole = client.responses.create(**request, max_output_tokens=MAX_TOKENS, extra_body=GREEDY)
    item, message = whole.output
    assert item.type == "reasoning" and item.summary == []
    assert [(p.type, p.text) for p in item.content] == [("reasoning_text", thought)]
    assert whole.output_text == rest
    events = list(
        client.responses.create(
            **request, max_output_tokens=MAX_TOKENS, extra_body=GREEDY, stream=True
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == thought and done == [thought]
    final = events[-1].response
    assert final.output[0].content[0].text == thought and final.output_text == rest
    assert whole.usage.output_tokens == raw.usage.completion_tokens


def _next_turn_ids(server, body: dict, shape) -> list[int]:
    """The prompt ids of a request in an API's ``shape``, as the server makes them."""
    asked = shape.model_validate(body)
    chat = body if shape is ChatCompletionRequest else asked.as_chat()
    return _encode(server.state, ChatCompletionRequest.model_validate(chat), chat=True)


def test_earlier_reasoning_sent_back_starts_the_next_turn_with_the_tokens_generated(server):
    state = server.state
    first = ChatCompletionRequest(model="tiny", messages=QUESTION)
    prompt = _encode(state, first, chat=True)
    generated = list(state.lm.generate(prompt, max_new_tokens=MAX_TOKENS, drafter="none").token_ids)
    while generated and generated[-1] in state.lm.eos_token_ids:
        generated.pop()
    client = server.client()
    chat = (
        client.chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=MAX_TOKENS, extra_body=GREEDY
        )
        .choices[0]
        .message
    )
    thought, text = chat.model_extra["reasoning_content"], chat.content
    again = {"role": "user", "content": "And at night?"}
    bodies = {
        ChatCompletionRequest: {"model": "tiny", "messages": [*QUESTION, {"role": "assistant", "content": text, "reasoning_content": thought}, again]},
        MessagesRequest: {"model": "tiny", "max_tokens": 5, "messages": [*QUESTION, {"role": "assistant", "content": [{"type": "thinking", "thinking": thought, "signature": ""}, {"type": "text", "text": text}]}, again]},
        ResponsesRequest: {"model": "tiny", "input": [*QUESTION, {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": thought}]}, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}, again]},
    }  # fmt: skip
    for shape, body in bodies.items():
        ids = _next_turn_ids(server, body, shape)
        assert ids[: len(prompt) + len(generated)] == prompt + generated, shape.__name__
    # Without the reasoning, the turn matches up to the answer only.
    plain = [*QUESTION, {"role": "assistant", "content": text}, again]
    ids = _next_turn_ids(server, {"model": "tiny", "messages": plain}, ChatCompletionRequest)
    assert ids[: len(prompt) + len(generated)] != prompt + generated


def test_reasoning_format_none_keeps_the_answer_whole():
    settings = ServerSettings(generation_options=FIXED, reasoning_format="none")
    with RunningServer(create_app(think_lm("keyed"), settings)) as off:
        assert off.state.reasoning is None
        answer = off.client().chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=MAX_TOKENS, extra_body=GREEDY
        )
    message = answer.choices[0].message
    assert "</think>" in message.content and "reasoning_content" not in message.model_extra
