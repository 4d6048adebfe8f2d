"""Tools through the model's own chat template (:mod:`promptlookup.server.tool_template`): a
template that takes tools in the Hermes format (``<tool_call>`` JSON ``</tool_call>``, as
Qwen's) lists them and the history's calls and results, the grammar forces the format and
``tool_choice``, and the calls come back through the official ``openai`` and ``anthropic``
clients, whole and streamed; the output equals plain constrained decoding. A template without
tools (the default model's) keeps the generic format. A tiny model over printable ASCII and
newline, with a Qwen-like template."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from _server import FIXED, RunningServer
from conftest import AsciiTokenizer, tiny_llama
from test_server_tools import MESSAGES, TOOLS, WEATHER, streamed

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel
from promptlookup.server import ServerSettings, create_app
from promptlookup.server.openai.protocol import ChatCompletionRequest
from promptlookup.server.reading import ToolStream, parse
from promptlookup.server.tool_template import TemplateFormat, detect, encode
from promptlookup.server.tools import ToolPlan

#: A template in Qwen2.5's manner: tools listed in the system message, calls in ``<tool_call>``.
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
You may call functions. Their signatures, within <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Answer a call as <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}
{%- for call in message.tool_calls %}{% if not loop.first %}{{ '\n' }}{% endif %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
NEWLINE = 96
HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And in Oslo?"},
]
GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 150}


class TemplateTokenizer(AsciiTokenizer):
    """:class:`AsciiTokenizer` with a newline (id 96) and a chat template rendered as
    transformers renders one."""

    vocab_size = 97

    def __init__(self, template: str = HERMES_TEMPLATE) -> None:
        self.chat_template = template

    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": [NEWLINE if c == "\n" else i for c, i in zip(text, ids)]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\n" if i == NEWLINE else AsciiTokenizer.decode(self, [i]) for i in ids)

    def apply_chat_template(
        self, messages, tools=None, add_generation_prompt=False, tokenize=True, **_
    ):
        from transformers.utils.chat_template_utils import render_jinja_template

        (text,), _ = render_jinja_template(
            [messages],
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
        )
        return self(text)["input_ids"] if tokenize else text


def template_lm(template: str = HERMES_TEMPLATE) -> LanguageModel:
    model = tiny_llama(vocab_size=TemplateTokenizer.vocab_size, seed=5, context=2048)
    tokenizer = TemplateTokenizer(template)
    return LanguageModel(TorchTarget(model), tokenizer, name="tiny", model=model)


@pytest.fixture(scope="module")
def lm():
    return template_lm()


@pytest.fixture(scope="module")
def server(lm):
    with RunningServer(create_app(lm, ServerSettings(generation_options=FIXED))) as s:
        yield s


def test_the_format_is_read_off_the_template_and_others_keep_the_generic_one(default_lm):
    assert detect(TemplateTokenizer()) == TemplateFormat("<tool_call>\n", "\n</tool_call>", "\n")
    tight = HERMES_TEMPLATE.replace("<tool_call>\n{", "<tool_call>{").replace(
        "}\n</tool_call>", "}</tool_call>"
    )
    assert detect(TemplateTokenizer(tight)) == TemplateFormat("<tool_call>", "</tool_call>", "\n")
    # Tools listed, calls written some other way; or no template: the generic format.
    other = HERMES_TEMPLATE.replace("<tool_call>", "[TOOL_CALLS]")
    assert detect(TemplateTokenizer(other)) is None
    assert detect(AsciiTokenizer()) is None
    assert detect(default_lm.tokenizer) is None  # SmolLM2's template has no tools


def test_the_template_lists_the_tools_and_renders_the_history_of_calls(lm):
    template = detect(lm.tokenizer)
    req = ChatCompletionRequest(model="tiny", messages=HISTORY, tools=TOOLS)
    ids = encode(lm, req.prompt_messages(template), req.template_tools(template))
    prompt = lm.tokenizer.decode(ids)
    assert '"name": "get_weather"' in prompt.split("<tools>\n")[1].split("</tools>")[0]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
    assert call + "</tool_call><|im_end|>" in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert prompt.endswith("And in Oslo?<|im_end|>\n<|im_start|>assistant\n")
    assert "You can call tools" not in prompt  # no generic instructions
    # tool_choice "none": the history still in the template's shapes, the tools not listed.
    none = ChatCompletionRequest(model="tiny", messages=HISTORY, tools=TOOLS, tool_choice="none")
    prompt = lm.tokenizer.decode(encode(lm, none.prompt_messages(template), None))
    assert call in prompt and "<tools>" not in prompt


def _accepts(lm, grammar, text: str) -> bool:
    from promptlookup.grammar import engine_tokenizer

    """Whether ``grammar`` takes ``text`` (as the tokenizer writes it) as a whole answer."""
    matcher = grammar.start(engine_tokenizer(lm.tokenizer, lm.eos_token_ids)).matcher
    ids = lm.tokenizer(text)["input_ids"]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


def test_the_grammar_forces_the_format_and_honours_tool_choice(lm):
    template = detect(lm.tokenizer)
    tools = [t["function"] for t in TOOLS]
    weather = '{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}'
    one = f"<tool_call>\n{weather}\n</tool_call>"
    time = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    auto = ToolPlan(tools, "auto", True, template).grammar()
    assert _accepts(lm, auto, one) and _accepts(lm, auto, f"{one}\n{time}")
    assert _accepts(lm, auto, "It is sunny.") and _accepts(lm, auto, f"Let me see.\n{one}")
    assert not _accepts(lm, auto, f"{one} and more") and not _accepts(lm, auto, f"a {one[:-1]}")
    assert not _accepts(lm, auto, one.replace('"days": 2', '"days": 9'))  # its schema
    required = ToolPlan(tools, "required", False, template).grammar()
    assert _accepts(lm, required, one) and not _accepts(lm, required, "It is sunny.")
    assert not _accepts(lm, required, f"{one}\n{time}")  # one call only
    named = ToolPlan(tools, "get_time", True, template).grammar()
    assert _accepts(lm, named, time) and not _accepts(lm, named, one)
    # With a response format beside the tools: its JSON, or calls; not free text.
    shaped = ToolPlan(tools, "auto", True, template, answer=ANSWER).grammar()
    assert _accepts(lm, shaped, '{"summary": "sunny"}') and _accepts(lm, shaped, one)
    assert not _accepts(lm, shaped, "It is sunny.") and not _accepts(lm, shaped, '{"x": 1}')
    assert not _accepts(lm, shaped, f'{{"summary": "sunny"}}\n{one}')


#: A response format's schema, beside the tools.
ANSWER = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("step", [1, 3, 7])
def test_a_streamed_answer_adds_up_to_the_whole_one(step):
    template = TemplateFormat()
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris", "n": [1, {}]}}\n'
        '</tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    )
    for answer in (text, "<tool_cal: not a call", f"Let me <tool_ see.\n{text}"):
        stream, content, calls = ToolStream(template), "", {}
        for start in range(0, len(answer), step):
            piece, deltas = stream.feed(answer[start : start + step])
            content += piece
            for delta in deltas:
                entry = calls.setdefault(delta["index"], [delta["function"].get("name"), ""])
                entry[1] += delta["function"]["arguments"]
        whole_content, whole = parse(answer, template)
        assert [tuple(c) for c in calls.values()] == [
            (call["function"]["name"], call["function"]["arguments"]) for call in whole
        ]
        assert content == (whole_content or "")
    assert json.loads(parse(text, template)[1][0]["function"]["arguments"])["city"] == "Pa}ris"
    assert parse(text[:-3], template) == (text[:-3], [])  # cut at a length: text
    assert parse(f"Let me see.\n{text}", template)[0] == "Let me see.\n"


def test_calls_come_back_through_the_openai_client_whole_and_streamed(server):
    client = server.client()
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for extra in ({"tool_choice": "required"}, {"parallel_tool_calls": False}):
        request = dict(messages=HISTORY, tools=TOOLS, **GREEDY, **extra)
        whole = client.chat.completions.create(**request).choices[0]
        content, calls, finish = streamed(client, **request)
        assert finish == whole.finish_reason
        if whole.finish_reason != "tool_calls":  # "auto" may answer in text
            assert content == whole.message.content and not calls
            continue
        assert whole.message.content is None and content == ""
        for call in whole.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        assert [(name, args) for _, name, args in calls.values()] == [
            (call.function.name, call.function.arguments) for call in whole.message.tool_calls
        ]
    named = {"type": "function", "function": {"name": "get_time"}}
    answer = client.chat.completions.create(
        messages=MESSAGES, tools=TOOLS, tool_choice=named, parallel_tool_calls=False, **GREEDY
    )
    assert [call.function.name for call in answer.choices[0].message.tool_calls] == ["get_time"]


def test_the_anthropic_client_gets_tool_use_blocks(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    tools = [{"name": "get_weather", "description": "the weather", "input_schema": WEATHER}]
    request = dict(
        model="tiny",
        max_tokens=150,
        messages=[{"role": "user", "content": "Weather in Oslo for 2 days?"}],
        tools=tools,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    whole = client.messages.create(**request)
    (use,) = [block for block in whole.content if block.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert [block.input for block in final.content if block.type == "tool_use"] == [use.input]


def test_output_under_the_template_grammar_equals_plain_constrained_decoding(lm):
    """Greedy and seeded sampling, with forced tokens and prompt lookup's drafts."""
    template = detect(lm.tokenizer)
    req = ChatCompletionRequest(model="tiny", messages=HISTORY, tools=TOOLS)
    ids = encode(lm, req.prompt_messages(template), req.template_tools(template))
    for choice in ("required", "auto"):
        plan = ToolPlan(req.tool_plan(template).tools, choice, True, template)
        options = dict(max_new_tokens=120, grammar=plan.grammar())
        plain = lm.generate(ids, drafter="none", **options)
        fast = lm.generate(ids, drafter="prompt-lookup", **options)
        assert fast.token_ids == plain.token_ids
        if choice == "required":  # the call's tags, keys and name were drafted for free
            assert plain.text.startswith("<tool_call>\n{") and plain.finish_reason == "stop"
            assert fast.stats.forced_tokens > 0
            assert fast.stats.forward_passes < plain.stats.forward_passes / 3
    required = ToolPlan(plan.tools, "required", False, template).grammar()
    sampled = dict(max_new_tokens=120, temperature=1.0, top_k=8, grammar=required)
    for seed in (0, 1):
        plain = lm.generate(ids, drafter="none", seed=seed, **sampled)
        fast = lm.generate(ids, drafter="prompt-lookup", seed=seed, **sampled)
        assert fast.token_ids == plain.token_ids


def bpe_lm() -> LanguageModel:
    """A Hugging Face fast tokenizer (byte-level BPE, trained here) whose tags are added
    tokens, as Qwen's are, with the template; the tiny model over its vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=alphabet
    )
    corpus = [json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "days": 3}})]
    backend.train_from_iterator(corpus * 10 + [HERMES_TEMPLATE], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])  # not special: decoded as text
    tokenizer.chat_template = HERMES_TEMPLATE
    model = tiny_llama(vocab_size=len(tokenizer), seed=3, context=2048)
    return LanguageModel(TorchTarget(model), tokenizer, name="bpe", model=model)


def test_tags_that_are_tokens_are_matched_as_those_tokens():
    lm = bpe_lm()
    template = detect(lm.tokenizer, lm.eos_token_ids)
    opening, closing = (
        lm.tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")
    )
    assert (template.opening_token, template.closing_token) == (opening, closing)
    req = ChatCompletionRequest(
        model="bpe",
        messages=HISTORY,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    ids = encode(lm, req.prompt_messages(template), req.template_tools(template))
    assert opening in ids and '"name": "get_time"' in lm.tokenizer.decode(ids)
    grammar = req.grammar(template)
    call = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert _accepts(lm, grammar, call)  # as the tokenizer writes it: the tags as tokens
    auto = ToolPlan(req.tool_plan(template).tools, "auto", True, template).grammar()
    assert _accepts(lm, auto, "Let me see.") and _accepts(lm, auto, f"Let me see.\n{call}")
    assert not _accepts(lm, auto, f"{call} and more")
    plain = lm.generate(ids, max_new_tokens=80, drafter="none", grammar=grammar)
    fast = lm.generate(ids, max_new_tokens=80, drafter="prompt-lookup", grammar=grammar)
    assert fast.token_ids == plain.token_ids and plain.token_ids[0] == opening
    content, (found,) = parse(plain.text, template)
    assert content is None and found["function"]["name"] in ("get_weather", "get_time")


def test_text_before_a_call_streams_first_to_both_apis():
    """A delta that ends the text and begins the call: the text's content delta (OpenAI) or
    text block (Anthropic) comes before the call's."""
    import asyncio
    from types import SimpleNamespace

    from promptlookup.server.anthropic.serving import EventWriter
    from promptlookup.server.openai.answers import ChunkEvents

    template = TemplateFormat()
    plan = ToolPlan([{"name": "f", "parameters": {"type": "object"}}], "auto", True, template)
    answer = 'Let me see.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    pieces = [answer[:9], answer[9:60], answer[60:]]  # the second ends the text, begins the call
    events = asyncio.Queue()
    for piece in pieces:
        events.put_nowait(("delta", (0, piece, None)))
    stats = SimpleNamespace(cached_tokens=0)
    result = SimpleNamespace(finish_reason="stop", prompt_ids=[], text=answer, stats=stats)
    events.put_nowait(("choice", SimpleNamespace(index=0, result=result, tokens=9)))
    events.put_nowait(("done", []))
    job = SimpleNamespace(events=events, cancel=lambda: None)
    writer = ChunkEvents({"id": "x", "created": 0, "model": "tiny"}, True, "fp", False, plan)

    async def stream():
        return "".join([c async for c in writer.events(job)])

    streamed = asyncio.run(stream()).split("\n\n")
    assert streamed[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(c[6:])["choices"][0] for c in streamed[:-2]]
    assert chunks[-1]["finish_reason"] == "tool_calls"
    deltas = [c["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    first_call = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert (
        content == "Let me see.\n"
        and "".join(d.get("content") or "" for d in deltas[:first_call]) == content
    )
    arguments = "".join(
        call["function"]["arguments"] or "" for d in deltas for call in d.get("tool_calls") or ()
    )
    assert json.loads(arguments) == {"a": 1}
    writer = EventWriter("msg", "tiny", 3, plan)
    streamed = "".join(writer.delta(0, piece, None) for piece in pieces)
    kinds = [
        json.loads(line[6:]).get("content_block", {}).get("type")
        for line in streamed.splitlines()
        if line.startswith("data: ") and "content_block_start" in line
    ]
    assert kinds == ["text", "tool_use"]
