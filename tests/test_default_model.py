"""Integration on the real default model (SmolLM2-135M-Instruct in its Q4_1 weights) and a real
code-edit request from ../shared/data: prompt lookup gives exactly plain decoding's greedy tokens
(in at most half the forward passes when whole drafts are verified), through the API and the
CLI. Plain decoding here is promptlookup's own (``drafter="none"``): the quantized layers run in
one C call that rounds norms and SiLU its own way, so ``model.generate`` over the same modules
(torch's rounding) is close to it, not bit-identical; test_loop_greedy.py pins tiny float32
models against ``model.generate``."""

from __future__ import annotations

import json

import pytest
from _fixtures import cached_default_model, one_thread  # noqa: F401 (fixtures)
from click.testing import CliRunner

from promptlookup.cli import main

pytestmark = pytest.mark.slow
MAX_NEW = 128


@pytest.fixture(scope="module")
def code_edit_row(shared_data) -> dict:
    """The first code-edit request (messages with one user turn)."""
    with open(shared_data / "code_edit.jsonl", encoding="utf-8") as f:
        row = json.loads(f.readline())
    assert row["messages"] and row["messages"][-1]["role"] == "user"
    return row


@pytest.fixture(scope="module")
def expected_tokens(default_lm, code_edit_row) -> list[int]:
    prompt_ids = default_lm.encode(code_edit_row["messages"])
    # The chat template was applied: the prompt holds the request and ends with the
    # assistant's turn.
    text = default_lm.tokenizer.decode(prompt_ids)
    assert code_edit_row["messages"][0]["content"][:200] in text
    assert text.rstrip().endswith("assistant")
    return default_lm.generate(prompt_ids, max_new_tokens=MAX_NEW, drafter="none").token_ids


def test_prompt_lookup_equals_plain_greedy_on_a_code_edit(
    default_lm, code_edit_row, expected_tokens
):
    # Whole drafts verified (speculation="fixed"): the forward-pass count depends only on the
    # drafts, not on timing (the adaptive default trims drafts by measured costs; its output
    # is checked through the CLI below).
    result = default_lm.generate(
        code_edit_row["messages"], max_new_tokens=MAX_NEW, speculation="fixed"
    )
    assert result.token_ids == expected_tokens
    assert result.text == default_lm.tokenizer.decode(expected_tokens, skip_special_tokens=True)
    stats = result.stats
    assert stats.new_tokens == len(expected_tokens) > 32
    assert stats.forward_passes < stats.new_tokens / 2
    assert 0 < stats.accepted_tokens <= stats.drafted_tokens


def test_cli_on_a_code_edit_matches_plain_decoding(
    cached_default_model, code_edit_row, expected_tokens
):
    """``generate --json --chat`` with the default drafter and speculation: plain decoding's
    tokens. How many forward passes the adaptive default saves depends on the machine's measured
    costs, so it is not asserted here (it is above, for whole drafts)."""
    request = code_edit_row["messages"][0]["content"]
    result = CliRunner().invoke(
        main, ["generate", "--json", "--chat", "--max-new-tokens", str(MAX_NEW), request]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["token_ids"] == expected_tokens
    stats = data["stats"]
    assert stats["new_tokens"] == len(expected_tokens)
    assert stats["accepted_tokens"] <= stats["drafted_tokens"]
    assert (
        stats["forward_passes"] + stats["accepted_tokens"] == stats["new_tokens"]
        or expected_tokens[-1] in cached_default_model.eos_token_ids
    )
