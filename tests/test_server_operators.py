"""The operators' endpoints: ``GET /metrics`` (Prometheus, scraped and parsed with
``prometheus_client``'s parser), ``POST /tokenize`` and ``POST /detokenize`` (llama-server's
and vLLM's shapes), behind the API key; and ``GET /health``, open, showing nothing that
moves with anyone's requests."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import anthropic
import httpx
import pytest
from _server import CONTEXT, FIXED, MESSAGES, MODEL, RunningServer, tiny_lm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_server_fuzz import JSON

from promptlookup.server import ServerSettings, create_app

ALICE, BOB = {"Authorization": "Bearer a-key"}, {"Authorization": "Bearer b-key"}
JSON_TYPE = {"Content-Type": "application/json"}
#: Every field /tokenize and /detokenize read.
TOKENIZE_FIELDS = [
    "model",
    "content",
    "prompt",
    "messages",
    "tools",
    "add_special",
    "add_special_tokens",
    "with_pieces",
    "return_token_strs",
    "tokens",
]


@pytest.fixture(scope="module")
def lm():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    return tiny_lm()


@pytest.fixture(scope="module")
def server(lm, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text("alice a-key\nbob b-key\n")
    settings = ServerSettings(api_keys_file=str(keys), generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        yield running


def scrape(running, headers=ALICE) -> dict:
    """Every sample of ``/metrics``: ``{(name, frozenset(labels)): value}``."""
    answer = httpx.get(running.url + "/metrics", headers=headers, timeout=60)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert "a-key" not in answer.text and "b-key" not in answer.text  # tenants, never keys
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def moved(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def chat(running, headers, **body):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, **body}
    answer = httpx.post(
        running.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert answer.status_code == 200, answer.text
    if not body.get("stream"):
        return answer.json()["usage"]
    chunks = [json.loads(line[6:]) for line in answer.text.splitlines() if line[:7] == "data: {"]
    return chunks[-1]["usage"]


def test_metrics_count_each_request_tokens_and_tenant(server):
    before = scrape(server)
    usages = {
        "alice": [chat(server, ALICE), chat(server, ALICE)],  # the second finds the first cached
        "bob": [chat(server, BOB, stream=True, stream_options={"include_usage": True})],
    }
    refused = httpx.post(
        server.url + "/v1/chat/completions", json={"model": MODEL}, headers=BOB, timeout=60
    )
    assert refused.status_code == 400
    messages = anthropic.Anthropic(base_url=server.url, api_key="a-key", max_retries=0, timeout=60)
    message = messages.messages.create(model=MODEL, max_tokens=6, messages=MESSAGES)
    after = scrape(server)

    requests = "promptlookup:http_requests_total"
    api = "chat.completions"
    assert moved(before, after, requests, api=api, status="200", tenant="alice") == 2
    assert moved(before, after, requests, api=api, status="200", tenant="bob") == 1
    assert moved(before, after, requests, api=api, status="400", tenant="bob") == 1
    assert moved(before, after, requests, api="messages", status="200", tenant="alice") == 1
    assert moved(before, after, requests, api="metrics", status="200", tenant="alice") == 1
    # Tokens and drafts: what the answers' usage reported, per tenant.
    in_messages = message.usage.input_tokens + message.usage.cache_read_input_tokens
    expected = {
        "alice": {
            "vllm:prompt_tokens_total": sum(u["prompt_tokens"] for u in usages["alice"])
            + in_messages,
            "vllm:generation_tokens_total": sum(u["completion_tokens"] for u in usages["alice"])
            + message.usage.output_tokens,
            "vllm:prefix_cache_hits_total": sum(
                u["prompt_tokens_details"]["cached_tokens"] for u in usages["alice"]
            )
            + message.usage.cache_read_input_tokens,
        },
        "bob": {
            "vllm:prompt_tokens_total": usages["bob"][0]["prompt_tokens"],
            "vllm:generation_tokens_total": usages["bob"][0]["completion_tokens"],
            "vllm:prefix_cache_hits_total": 0,
        },
    }
    for tenant, counts in expected.items():
        for name, count in counts.items():
            assert moved(before, after, name, tenant=tenant) == count, (tenant, name)
        queries = moved(before, after, "vllm:prefix_cache_queries_total", tenant=tenant)
        assert queries == counts["vllm:prompt_tokens_total"]
    assert expected["alice"]["vllm:prefix_cache_hits_total"] > 0  # the repeat was cached
    speculative = [u["speculative"] for u in usages["bob"]]
    for name, field in (
        ("vllm:spec_decode_num_draft_tokens_total", "drafted_tokens"),
        ("vllm:spec_decode_num_accepted_tokens_total", "accepted_tokens"),
        ("promptlookup:forward_passes_total", "forward_passes"),
    ):
        assert moved(before, after, name, tenant="bob") == sum(s[field] for s in speculative)
    # Every ended request observed once; finish reasons counted per sequence.
    for name in (
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ):
        assert moved(before, after, name) == 4, name
    assert moved(before, after, "vllm:request_success_total") == 4
    assert moved(before, after, "vllm:e2e_request_latency_seconds_sum") > 0
    assert value(after, "vllm:num_requests_running") == value(after, "vllm:num_requests_waiting")
    assert value(after, "vllm:num_requests_waiting") == 0
    # The prefix cache's bytes, by tenant, within its budget.
    held = {t: value(after, "promptlookup:prefix_cache_bytes", tenant=t) for t in ("alice", "bob")}
    budget = value(after, "promptlookup:prefix_cache_budget_bytes")
    assert 0 < held["alice"] and 0 < held["bob"] and sum(held.values()) <= budget == 64 * 2**20


def test_the_operators_endpoints_need_a_key_and_health_shows_no_traffic(server):
    for method, path in (("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/detokenize")):
        answer = httpx.request(method, server.url + path, json={}, timeout=60)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    chat(server, ALICE)
    health = httpx.get(server.url + "/health", timeout=60).json()
    assert health == {
        "status": "ok",
        "model": MODEL,
        "queue": {"capacity": 16, "max_batch": server.state.max_batch},
        "prefix_cache": {"budget_mib": 64},  # with the default disk tier
    }


def tokenize(running, **body):
    return httpx.post(running.url + "/tokenize", json=body, headers=ALICE, timeout=60)


def test_tokenize_takes_llama_servers_and_vllms_shapes(server, lm):
    ids = lm.tokenizer("abcd abcd", add_special_tokens=False)["input_ids"]
    llama = tokenize(server, content="abcd abcd").json()
    assert llama == {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT}
    vllm = tokenize(server, model=MODEL, prompt="abcd abcd", add_special_tokens=True).json()
    assert vllm["tokens"] == lm.tokenizer("abcd abcd")["input_ids"] and vllm["count"] == len(ids)
    pieces = tokenize(server, content="abcd", with_pieces=True, return_token_strs=True).json()
    assert [t["piece"] for t in pieces["tokens"]] == pieces["token_strs"] == list("abcd")
    assert [t["id"] for t in pieces["tokens"]] == lm.tokenizer("abcd")["input_ids"]
    # Chat messages: the prompt a chat request of the same messages has.
    usage = chat(server, ALICE, max_tokens=1)
    counted = tokenize(server, model=MODEL, messages=MESSAGES).json()
    assert counted["count"] == usage["prompt_tokens"] == len(counted["tokens"])
    text = httpx.post(
        server.url + "/detokenize", json={"tokens": ids}, headers=ALICE, timeout=60
    ).json()
    decoded = lm.tokenizer.decode(ids, skip_special_tokens=False)
    assert text == {"content": decoded, "prompt": decoded}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": "ab", "prompt": "ab"}, "content"),
        ("/tokenize", {"content": "ab", "model": "other"}, "model"),
        ("/tokenize", {"content": 3}, "content"),
        ("/tokenize", {"content": "ab " * 30_000}, "content"),  # more characters than fit
        ("/tokenize", {"prompt": "ab " * 7_000}, "content"),  # more tokens, found in chunks
        ("/tokenize", {"content": "ab " * 200}, "content"),  # more tokens, in one piece
        ("/detokenize", {"tokens": [1, 99]}, "tokens"),
        ("/detokenize", {"tokens": [1] * (CONTEXT + 1)}, "tokens"),
        ("/detokenize", {"tokens": "ab"}, "tokens"),
    ],
)
def test_tokenize_and_detokenize_refuse_bad_input_with_a_400(server, path, body, param):
    answer = httpx.post(server.url + path, json=body, headers=ALICE, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_openapi_describes_the_operators_endpoints(server):
    doc = httpx.get(server.url + "/openapi.json", timeout=60).json()
    for path, model in (("/tokenize", "TokenizeRequest"), ("/detokenize", "DetokenizeRequest")):
        operation = doc["paths"][path]["post"]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith(model) and operation["security"] == [{"bearer": []}]
    assert {"content", "prompt", "messages", "add_special", "add_special_tokens"} <= set(
        doc["components"]["schemas"]["TokenizeRequest"]["properties"]
    )
    assert "401" in doc["paths"]["/metrics"]["get"]["responses"]


def test_the_docs_list_every_metric(server):
    docs = (Path(__file__).resolve().parents[1] / "docs" / "server.md").read_text()
    families = list(server.state.metrics.registry.collect())
    assert len(families) >= 19
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` |" in docs, name


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/tokenize", "/detokenize"]),
    body=st.dictionaries(st.sampled_from(TOKENIZE_FIELDS), JSON, max_size=4) | JSON,
)
def test_tokenize_never_answers_a_5xx(server, path, body):
    answer = httpx.post(
        server.url + path, content=json.dumps(body), headers=ALICE | JSON_TYPE, timeout=60
    )
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 400:
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
