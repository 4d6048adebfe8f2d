"""The answer is cached too (:mod:`promptlookup.rendering`): a conversation's next turn
starts with the token ids of the turn before it and of the answer the model generated (up to
its end marker), for a text answer, a call in the chat template's Hermes format and a call in
the generic format; the cut at each answer's start changes no token of an ordinary prompt;
and with the prefix cache a next turn finds that answer cached, with the same output as
without the cache. Tiny in-process models, and the real default model (slow)."""

from __future__ import annotations

import pytest
from conftest import TinyTokenizer
from test_server_tool_template import HISTORY, bpe_lm, template_lm
from test_server_tools import TOOLS

from promptlookup.prefix_cache import PrefixCache
from promptlookup.prompts import apply_chat_template
from promptlookup.rendering import answer_starts, cuts_safely, segmented_ids
from promptlookup.server.openai.protocol import ChatCompletionRequest
from promptlookup.server.reading import read_answer
from promptlookup.server.tool_template import detect, encode

#: ChatML without tools: tools go through the generic format.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]


def turn(lm, messages, tools=None, choice=None, max_new_tokens=60, parallel=True, **options):
    """One turn as the server takes it: ``(prompt ids, the answer's result, the assistant
    message a client sends back)``."""
    req = request(lm, messages, tools, choice, parallel)
    template = detect(lm.tokenizer, lm.eos_token_ids)
    ids = encode(lm, req.prompt_messages(template), req.template_tools(template))
    grammar = req.grammar(template)
    result = lm.generate(ids, max_new_tokens=max_new_tokens, grammar=grammar, **options)
    content, calls = read_answer(result.text, req.tool_plan(template))
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ids, result, message


def next_messages(messages: list[dict], answer: dict) -> list[dict]:
    """The conversation with the answer, its calls' results and a new question."""
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}
        for call in answer.get("tool_calls", ())
    ]
    return [*messages, answer, *results, {"role": "user", "content": "And in Oslo?"}]


def assert_next_turn_starts_with_the_answer(lm, messages, tools=None, choice=None) -> None:
    ids, result, answer = turn(lm, messages, tools, choice)
    generated = list(result.token_ids)
    while generated and generated[-1] in lm.eos_token_ids:  # the end marker: the template's
        generated.pop()
    assert generated, "the answer is empty"
    following = turn_ids(lm, next_messages(messages, answer), tools, choice)
    assert following[: len(ids) + len(generated)] == ids + generated


def request(lm, messages, tools=None, choice=None, parallel=True) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model=lm.name,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel if tools else None,
    )


def turn_ids(lm, messages, tools=None, choice=None, parallel=True) -> list[int]:
    req = request(lm, messages, tools, choice, parallel)
    template = detect(lm.tokenizer, lm.eos_token_ids)
    return encode(lm, req.prompt_messages(template), req.template_tools(template))


def test_a_text_answer_starts_the_next_turn():
    assert_next_turn_starts_with_the_answer(template_lm(CHATML), QUESTION)


def test_a_generic_format_call_starts_the_next_turn():
    lm = template_lm(CHATML)
    assert detect(lm.tokenizer) is None  # no tools in the template
    assert_next_turn_starts_with_the_answer(lm, QUESTION, TOOLS, "required")
    assert_next_turn_starts_with_the_answer(lm, QUESTION, TOOLS, "auto")


def test_a_hermes_format_call_starts_the_next_turn():
    lm = template_lm()
    assert detect(lm.tokenizer) is not None
    assert_next_turn_starts_with_the_answer(lm, HISTORY, TOOLS, "required")
    assert_next_turn_starts_with_the_answer(lm, HISTORY, TOOLS, "auto")


def test_a_hermes_call_in_byte_level_bpe_with_tags_as_tokens_starts_the_next_turn():
    """A random model writes words in pieces a tokenizer would merge ("w", "eat", "her"),
    which no re-rendering can give back: the next turn starts with the answer's text
    tokenized (``tokenize(decode(ids))``, the answer's own ids for a canonical one), the
    tags as their tokens."""
    lm = bpe_lm()
    ids, result, answer = turn(lm, HISTORY, TOOLS, "required", 120, parallel=False)
    assert answer.get("tool_calls") and result.finish_reason == "stop"
    canonical = lm.tokenizer(result.text, add_special_tokens=False)["input_ids"]
    following = turn_ids(lm, next_messages(HISTORY, answer), TOOLS, "required", False)
    assert following[: len(ids) + len(canonical)] == ids + canonical


@pytest.mark.filterwarnings("ignore:tiny has no chat template")
def test_a_base_models_answer_starts_the_next_turn():
    """Without a chat template the contents are joined by blank lines, an answer right
    after what it answered, as the model continued it."""
    from test_server_tools import ascii_lm

    lm = ascii_lm()
    assert_next_turn_starts_with_the_answer(lm, QUESTION)
    assert_next_turn_starts_with_the_answer(lm, QUESTION, TOOLS, "required")
    messages = [*QUESTION, {"role": "assistant", "content": "Sunny."}, *QUESTION]
    text = f"{QUESTION[0]['content']}Sunny.\n\n{QUESTION[0]['content']}"
    assert lm.encode(messages) == lm.tokenizer(text)["input_ids"]


def test_the_cut_is_where_each_answer_begins():
    tokenizer = bpe_lm().tokenizer

    def render(items, opened=True):
        return apply_chat_template(tokenizer, items, add_generation_prompt=opened, tokenize=False)

    messages = [*QUESTION, {"role": "assistant", "content": "\n\nSunny."}, *QUESTION]
    text = render(messages)
    (start,) = answer_starts(text, messages, render)
    assert text[:start] == render(messages[:1]) and text[start:].startswith("\n\nSunny.")
    # Each piece alone: the answer's whitespace is not merged with the turn's opening.
    assert apply_chat_template(tokenizer, messages) == segmented_ids(tokenizer, text, [start])
    expected = tokenizer(text[:start])["input_ids"] + tokenizer(text[start:])["input_ids"]
    assert apply_chat_template(tokenizer, messages) == expected


def test_a_tokenizer_that_would_change_a_probe_keeps_the_text_whole():
    class PrefixSpace(TinyTokenizer):
        """Adds a space before every text it tokenizes, as SentencePiece's dummy prefix."""

        def __call__(self, text, add_special_tokens=True):
            return super().__call__(" " + text)

    tokenizer = PrefixSpace(32)
    assert not cuts_safely(tokenizer)
    assert segmented_ids(tokenizer, "abcd", [2]) == tokenizer("abcd")["input_ids"]
    assert cuts_safely(TinyTokenizer(32))


@pytest.mark.slow
def test_the_default_models_ordinary_prompts_keep_their_tokens(default_lm):
    tokenizer = default_lm.tokenizer
    assert cuts_safely(tokenizer)
    answers = ["Sunny, 21 C.", "It is **sunny**:\n- 21 C", '{"tool_calls": [{"name": "f"}]}', "42"]
    for answer in answers:
        messages = [*QUESTION, {"role": "assistant", "content": answer}, *QUESTION]
        whole = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        whole = list(whole["input_ids"] if hasattr(whole, "keys") else whole)
        assert apply_chat_template(tokenizer, messages) == whole


@pytest.mark.slow
def test_the_default_models_next_turn_finds_its_answer_cached(default_lm):
    """Text and generic-format calls: the next turn's prompt starts with the answer, the
    prefix cache finds it (all but the last token, whose keys were never computed), and the
    output with the cache equals the output without it (greedy)."""
    lm = default_lm
    for tools, choice in ((None, None), (TOOLS, "required")):
        cache = PrefixCache(mib=64)
        ids, result, answer = turn(lm, QUESTION, tools, choice, 24, prefix_cache=cache)
        generated = [t for t in result.token_ids if t not in lm.eos_token_ids]
        following = next_messages(QUESTION, answer)
        again = turn_ids(lm, following, tools, choice)
        assert again[: len(ids) + len(generated)] == ids + generated
        grammar = request(lm, following, tools, choice).grammar(None)
        cached = lm.generate(again, max_new_tokens=24, grammar=grammar, prefix_cache=cache)
        plain = lm.generate(again, max_new_tokens=24, grammar=grammar, prefix_cache=False)
        assert cached.token_ids == plain.token_ids
        assert cached.stats.cached_tokens >= len(ids) + len(result.token_ids) - 1
