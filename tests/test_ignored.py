"""The rule for what a request carries that the server does not use (:mod:`promptlookup.server
.ignored`): the edit distance against a brute-force reference, which names are typos, the
headers' escaping and bound, and the warning logged once per kind of request."""

from __future__ import annotations

import logging
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptlookup.server.anthropic.protocol import MessagesRequest
from promptlookup.server.ignored import (
    FIELDS_HEADER,
    MAX_HEADER_CHARS,
    TOOLS_HEADER,
    close_name,
    collecting,
    distance,
    note,
)
from promptlookup.server.openai.protocol import ChatCompletionRequest
from promptlookup.server.request_base import APIError, parse_request


def reference(a: str, b: str) -> int:
    """Optimal string alignment distance, by its recursive definition."""

    @cache
    def d(i: int, j: int) -> int:
        if min(i, j) == 0:
            return max(i, j)
        best = min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
        if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
            best = min(best, d(i - 2, j - 2) + 1)
        return best

    return d(len(a), len(b))


@given(st.text("abc_", max_size=7), st.text("abc_", max_size=7))
def test_the_distance_is_the_reference_up_to_the_limits_it_is_used_at(a, b):
    assert min(distance(a, b), 3) == min(reference(a, b), 3)


@pytest.mark.parametrize(
    "name, known, meant",
    [
        ("max_token", ["max_tokens"], "max_tokens"),
        ("temprature", ["temperature"], "temperature"),
        ("Temperature", ["temperature"], "temperature"),
        ("tpo_p", ["top_p"], "top_p"),
        ("max_output_tokn", ["max_output_tokens"], "max_output_tokens"),
        ("store", ["stop"], None),  # two edits, five letters: a field of its own
        ("top_a", ["top_a"], None),  # the name itself
        ("user", ["use"], "use"),
        ("tol", ["tool"], None),  # under four letters: never a typo
        ("min_p", ["top_p", "top_k"], None),
        ("min_tokens", ["max_tokens"], None),  # vLLM's: two edits, but another server's field
        ("top_a", ["top_p"], None),  # OpenRouter's
    ],
)
def test_which_names_are_typos(name, known, meant):
    assert close_name(name, known) == meant


def test_the_headers_are_ascii_escaped_and_bounded():
    with collecting() as ignored:
        note("fields", "a,b\nc\u00e9")
        for index in range(500):
            note("tools", f"tools.{index} (web_search)")
    headers = dict(ignored.headers())
    assert headers[FIELDS_HEADER.encode()] == b"a\\x2cb\\nc\\xe9"
    tools = headers[TOOLS_HEADER.encode()].decode("ascii")
    assert tools.startswith("tools.0 (web_search), tools.1 (web_search)")
    assert tools.endswith(" more)") and len(tools) <= MAX_HEADER_CHARS + 20


def test_nothing_ignored_means_no_header_and_no_log(caplog):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "store": False}
    with caplog.at_level(logging.DEBUG, "promptlookup.server"), collecting() as ignored:
        parse_request(ChatCompletionRequest, body)
    assert ignored.headers() == [] and caplog.records == []


def test_a_kind_of_request_is_logged_as_a_warning_once(caplog):
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "web_fetch_20250910", "name": "fetch"}],
        "beta_thing_once": 1,
    }
    with caplog.at_level(logging.DEBUG, "promptlookup.server"):
        for _ in range(2):
            with collecting():
                request = parse_request(MessagesRequest, body)
    assert "tools" not in request.as_chat()
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    said = "ignored fields: beta_thing_once; tools left out: tools.0 (web_fetch_20250910)"
    assert levels == [(logging.WARNING, f"request: {said}"), (logging.DEBUG, f"request: {said}")]


def test_a_typo_inside_a_block_names_its_path():
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                     "cache_contrl": {}}]}],
    }  # fmt: skip
    with pytest.raises(APIError) as error:
        parse_request(MessagesRequest, body)
    assert error.value.message == (
        "messages.0.content.0.cache_contrl: unknown field; did you mean 'cache_control'?"
    )
    assert error.value.param == "messages"
