"""The API's edge: every number range-checked and strictly typed (400 with OpenAI's error
JSON, never a 500), the schema, model retrieval, logprobs and n through a real server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from _server import FIXED, MESSAGES, MODEL, RunningServer, tiny_lm
from pydantic import BaseModel

from promptlookup.server import ServerSettings, bodies, create_app
from promptlookup.server.anthropic import bodies as anthropic_bodies
from promptlookup.server.responses import bodies as responses_bodies

GOOD = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    with RunningServer(
        create_app(tiny_lm(row_by_row=True), ServerSettings(generation_options=FIXED))
    ) as s:
        yield s


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"temperature": 1e-38}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": 1, "repetition_penalty": 1e-40}, "repetition_penalty"),
        ({"temperature": 0, "repetition_penalty": 1e-40}, "repetition_penalty"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": 8.0}, "max_tokens"),
        ({"logprobs": 0}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_out_of_range_or_loosely_typed_numbers_are_a_400(server, extra, param):
    response = httpx.post(server.url + "/v1/chat/completions", json={**GOOD, **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_nan_in_the_body_is_a_400(server):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "ab"}], "top_p": NaN}'
    response = httpx.post(server.url + "/v1/chat/completions", content=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_p"


def test_a_lone_surrogate_in_a_field_name_is_a_400_in_valid_json(server):
    body = b'{"model": "tiny", "messages": [], "\\ud800": 1}'
    response = httpx.post(server.url + "/v1/chat/completions", content=body)
    assert response.status_code == 400 and response.json()["error"]["message"]


def test_a_seed_at_the_64_bit_limit_is_served(server):
    body = {**GOOD, "seed": 2**63 - 1}  # (a generous timeout: a busy machine, not a bound)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200


def test_completion_logprobs_beyond_5_is_a_400(server):
    response = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": "ab", "logprobs": 6}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"


def test_openapi_describes_the_request_bodies(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    assert {"messages", "logprobs", "top_logprobs", "n"} <= set(
        doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    )
    for path, model in [
        ("/v1/messages", "MessagesRequest"),
        ("/v1/messages/count_tokens", "MessagesRequest"),
        ("/v1/responses", "ResponsesRequest"),
    ]:
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].endswith(model)
    assert {"input", "tools", "text"} <= set(
        doc["components"]["schemas"]["ResponsesRequest"]["properties"]
    )


def test_models_retrieve_knows_the_served_model_only(server):
    assert server.client().models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("gpt-17")


def test_logprobs_with_a_prediction_equal_those_without(server):
    client = server.client()
    plain = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=20, logprobs=True, top_logprobs=3
    )
    answer = plain.choices[0].message.content
    predicted = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=20,
        logprobs=True,
        top_logprobs=3,
        prediction={"type": "content", "content": answer},
    )
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert plain.system_fingerprint and plain.system_fingerprint == predicted.system_fingerprint
    assert predicted.choices[0].logprobs.content == plain.choices[0].logprobs.content
    entries = plain.choices[0].logprobs.content
    assert len(entries) == plain.usage.completion_tokens
    assert all(len(e.top_logprobs) == 3 for e in entries)
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=20,
        logprobs=True,
        top_logprobs=3,
        stream=True,
    )
    pieces = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert pieces == entries


def test_n_choices_use_derived_seeds_and_sum_usage(server):
    client = server.client()
    many = client.completions.create(
        model=MODEL, prompt="abcd", n=3, seed=11, temperature=1, max_tokens=8
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    tokens = 0
    for i, choice in enumerate(many.choices):
        one = client.completions.create(
            model=MODEL, prompt="abcd", seed=11 + i, temperature=1, max_tokens=8
        )
        assert choice.text == one.choices[0].text
        tokens += one.usage.completion_tokens
    assert many.usage.completion_tokens == tokens
    assert many.usage.prompt_tokens == one.usage.prompt_tokens


@pytest.mark.parametrize("max_batch", [1, 4], ids=["one-at-a-time", "batched"])
def test_tokens_that_spell_the_stop_string_are_in_neither_logprobs_nor_usage(max_batch):
    lm = tiny_lm(row_by_row=True)
    whole = lm.generate(MESSAGES, max_new_tokens=24, temperature=0).text
    stop = whole[5:8]  # three one-character tokens: two inside the stop string, one completing it
    text = whole[: whole.index(stop)]
    settings = ServerSettings(max_batch=max_batch, generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        client = running.client()
        asked = dict(
            model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24, stop=stop, logprobs=True
        )
        answer = client.chat.completions.create(**asked)
        streamed = list(
            client.chat.completions.create(
                **asked, stream=True, stream_options={"include_usage": True}
            )
        )
        completion = client.completions.create(
            model=MODEL, prompt="abcd abcd abcd", temperature=0, max_tokens=24, logprobs=1
        )
        cut = completion.choices[0].text[3:5]  # two tokens, both left out
        stopped = client.completions.create(
            model=MODEL, prompt="abcd abcd abcd", temperature=0, max_tokens=24, logprobs=1, stop=cut
        )
    assert answer.choices[0].message.content == text
    entries = answer.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == text
    assert answer.usage.completion_tokens == len(entries) == len(text)  # one character a token
    pieces = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert pieces == entries and streamed[-1].usage.completion_tokens == len(text)
    kept, full = stopped.choices[0], completion.choices[0].text
    assert "".join(kept.logprobs.tokens) == kept.text == full[: full.index(cut)]
    assert stopped.usage.completion_tokens == len(kept.text)


def _extras(value) -> list:
    """Fields a validated body carries that its models do not declare (anywhere inside)."""
    if isinstance(value, BaseModel):
        found = list(value.model_extra or {})
        for name in type(value).model_fields:
            found += _extras(getattr(value, name))
        return found
    if isinstance(value, (list, tuple)):
        return [extra for item in value for extra in _extras(item)]
    if isinstance(value, dict):
        return [extra for item in value.values() for extra in _extras(item)]
    return []


def test_every_answer_is_a_documented_body(server):
    def post(path, **body):
        return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=60)

    def events(path, **body):
        with httpx.stream("POST", server.url + path, json={"model": MODEL, **body}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        return [json.loads(line.removeprefix("data: ")) for line in lines]

    chat = dict(messages=MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2)
    text = dict(prompt="abcd", max_tokens=6, logprobs=2)
    answers = [
        (bodies.ChatCompletion, post("/v1/chat/completions", **chat).json()),
        (bodies.Completion, post("/v1/completions", **text).json()),
        (bodies.ErrorResponse, post("/v1/completions", prompt="a", n=99).json()),
        (bodies.Health, httpx.get(server.url + "/health").json()),
        (bodies.ModelList, httpx.get(server.url + "/v1/models").json()),
        (bodies.ModelCard, httpx.get(server.url + f"/v1/models/{MODEL}").json()),
    ]
    include = {"stream": True, "stream_options": {"include_usage": True}}
    answers += [
        (bodies.ChatCompletionChunk, c) for c in events("/v1/chat/completions", **chat, **include)
    ]
    answers += [(bodies.CompletionChunk, c) for c in events("/v1/completions", **text, **include)]
    documented = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    for model, body in answers:
        assert model.__name__ in documented
        assert _extras(model.model_validate(body)) == [], (model.__name__, body)
        assert bodies.dump(model.model_validate(body)) == body  # nothing added or lost


#: Each API's answer and error models, as its routes declare them (their own shapes).
API_BODIES = {
    "/v1/chat/completions": (bodies.ChatCompletion, bodies.ErrorResponse),
    "/v1/completions": (bodies.Completion, bodies.ErrorResponse),
    "/v1/messages": (anthropic_bodies.AnthropicMessage, anthropic_bodies.AnthropicError),
    "/v1/messages/count_tokens": (
        anthropic_bodies.MessageTokenCount,
        anthropic_bodies.AnthropicError,
    ),
    "/v1/responses": (responses_bodies.ResponseObject, bodies.ErrorResponse),
}


def test_each_api_documents_its_answers_and_its_own_errors(server):
    """/openapi.json names each API's answer (200) and error models (its 4xx and 5xx), and
    holds those models' own schemas (no other model of the same name in their place); the
    answers the server sends are those models, nothing added or lost."""
    doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def named(response: dict) -> str:
        return response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]

    for path, (answer, error) in API_BODIES.items():
        responses = doc["paths"][path]["post"]["responses"]
        assert named(responses["200"]) == answer.__name__
        errors = {status: named(body) for status, body in responses.items() if status != "200"}
        assert {"400", "413", "500", "503"} <= set(errors) and "401" not in errors  # no keys
        assert set(errors.values()) == {error.__name__}
        for model in (answer, error):
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, part in {**schema.pop("$defs", {}), model.__name__: schema}.items():
                assert schemas[name] == part, (path, name)
    streamed = doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    assert "message_start" in streamed["text/event-stream"]["schema"]["description"]
    anthropic_error = schemas["AnthropicError"]["properties"]
    assert anthropic_error["type"]["const"] == "error" and "error" in anthropic_error

    def post(path, body):
        return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=60)

    message = {"max_tokens": 4, "messages": MESSAGES, "temperature": 0}
    answers = [
        ("/v1/messages", post("/v1/messages", message)),
        ("/v1/messages", post("/v1/messages", {"messages": MESSAGES})),  # no max_tokens
        ("/v1/messages/count_tokens", post("/v1/messages/count_tokens", message)),
        ("/v1/messages/count_tokens", post("/v1/messages/count_tokens", {"messages": 1})),
        ("/v1/responses", post("/v1/responses", {"input": "abcd", "max_output_tokens": 4})),
        ("/v1/responses", post("/v1/responses", {"input": "abcd", "max_output_tokens": 0})),
    ]
    assert [response.status_code for _, response in answers] == [200, 400] * 3
    for path, response in answers:
        model = API_BODIES[path][response.status_code != 200]
        body = response.json()
        assert _extras(model.model_validate(body)) == [], (path, body)
        assert bodies.dump(model.model_validate(body)) == body  # nothing added or lost
