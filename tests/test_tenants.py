"""Tenants and the server's prefix cache: several API keys (``--api-key`` repeated, a keys
file), the tenant named by the key itself whatever the header's spelling, each tenant's
prefix cache entries its own (unless ``--prefix-cache-scope global``), and
``usage.prompt_tokens_details.cached_tokens``, whole and streamed, with answers unchanged."""

from __future__ import annotations

import httpx
import pytest
from _server import FIXED, MODEL, RunningServer, tiny_lm
from click.testing import CliRunner

from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError
from promptlookup.server import ServerSettings, create_app
from promptlookup.server.tenants import Tenants, read_keys_file

# A prompt of several 32-token blocks, so that a repeat finds most of it cached.
LONG = [{"role": "user", "content": "abcdefgh ijklmnop " * 9}]


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# tenant key\nalice a-key-1\nalice a-key-2\n\nbob b-key\n")
    return path


def test_a_keys_file_names_each_keys_tenant(keys_file):
    assert read_keys_file(keys_file) == {"a-key-1": "alice", "a-key-2": "alice", "b-key": "bob"}
    tenants = Tenants.of(["solo"], keys_file)
    assert tenants.tenant("Bearer a-key-2") == tenants.tenant(b"Bearer a-key-1") == "alice"
    assert tenants.tenant("Bearer b-key") == "bob"
    assert tenants.tenant("Bearer solo").startswith("key-")
    assert tenants.tenant("Bearer nobody") is None and tenants.tenant(None) is None


@pytest.mark.parametrize(
    "spelling", ["Bearer b-key", "bearer b-key", "BEARER   b-key", " Bearer b-key  "]
)
def test_the_tenant_comes_from_the_key_not_the_headers_spelling(keys_file, spelling):
    assert Tenants.of((), keys_file).tenant(spelling) == "bob"


@pytest.mark.parametrize(
    "text, message",
    [
        ("alice\n", "expected 'TENANT KEY'"),
        ("alice k extra\n", "expected 'TENANT KEY'"),
        ("alice k\nbob k\n", "already on a line above"),
        ("# nothing\n", "no keys"),
    ],
)
def test_a_bad_keys_file_is_one_named_error(tmp_path, text, message):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(InvalidParameterError, match=message):
        Tenants.of((), path)


def chat(running, key: str, stream: bool = False) -> dict:
    body = {"model": MODEL, "messages": LONG, "max_tokens": 8, "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    response = httpx.post(
        running.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": key},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()
    import json

    chunks = [
        json.loads(line[5:])
        for line in response.text.splitlines()
        if line.startswith("data: {")  # the chunks, not [DONE]
    ]
    return {
        "text": "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        ),
        "usage": chunks[-1]["usage"],
    }


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def text(answer: dict) -> str:
    return answer.get("text") or answer["choices"][0]["message"]["content"]


def test_each_tenant_reuses_only_its_own_prefixes(lm, keys_file):
    settings = ServerSettings(
        api_keys_file=str(keys_file), model_id=MODEL, generation_options=FIXED
    )
    with RunningServer(create_app(lm, settings)) as running:
        first = chat(running, "Bearer a-key-1")
        assert cached(first) == 0
        # Bob has never sent it: nothing cached for him, whoever else did.
        bob = chat(running, "Bearer b-key", stream=True)
        assert cached(bob) == 0
        # Alice's other key and another spelling: the same tenant, her prefix found.
        again = chat(running, "bearer  a-key-2")
        assert cached(again) >= 32
        streamed = chat(running, "Bearer a-key-1", stream=True)
        assert cached(streamed) >= 32
        assert text(first) == text(bob) == text(again) == text(streamed)
        # /health shows the budget, not what anyone's requests left in the cache.
        assert httpx.get(running.url + "/health").json()["prefix_cache"] == {"budget_mib": 64}
        assert httpx.post(
            running.url + "/v1/chat/completions", json={}, headers={"Authorization": "Bearer x"}
        ).status_code == 401  # fmt: skip


def test_a_global_scope_shares_prefixes_across_tenants(lm):
    settings = ServerSettings(
        api_key=("k1", "k2"),
        prefix_cache_scope="global",
        model_id=MODEL,
        generation_options=FIXED,
    )
    with RunningServer(create_app(lm, settings)) as running:
        assert cached(chat(running, "Bearer k1")) == 0
        assert cached(chat(running, "Bearer k2")) >= 32


def test_a_zero_budget_turns_the_cache_off(lm):
    settings = ServerSettings(prefix_cache_mib=0, model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        answers = [chat(running, "Bearer none"), chat(running, "Bearer none", stream=True)]
        assert [cached(answer) for answer in answers] == [0, 0]
        assert running.state.prefix_cache is None


def test_the_flags_are_documented():
    assert ServerSettings().prefix_cache_mib is None  # 64 with the disk tier, 1024 without
    assert ServerSettings().prefix_cache_dir == "auto"
    help_text = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "[default: 64 with a disk tier, 1024 without]" in help_text
    assert "--prefix-cache-dir DIR|auto|none" in help_text
    assert "--prefix-cache-mib" in help_text and "--api-keys-file FILE" in help_text
    assert "--prefix-cache-scope [per-tenant|global]" in help_text


def test_one_generation_at_a_time_reuses_prefixes_too(lm):
    settings = ServerSettings(max_batch=1, model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        first, again = chat(running, "Bearer none"), chat(running, "Bearer none", stream=True)
        assert cached(first) == 0 and cached(again) >= 32 and text(first) == text(again)
