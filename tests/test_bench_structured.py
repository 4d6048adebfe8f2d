"""The bench's structured task: rows generated with their schemas or tools, answers checked
against them, and a run where plain constrained decoding (transformers' ``generate`` with the
grammar), promptlookup-none and promptlookup write the same valid answers."""

from __future__ import annotations

import json
import warnings

import pytest
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import AsciiTokenizer, tiny_llama

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.bench import BenchRow, Settings, run_bench
from promptlookup.bench.structured import (
    EXTRACTION,
    TOOLS,
    constraint,
    matches_schema,
    server_request,
)
from promptlookup.bench.suite import suite_rows
from promptlookup.generation import LanguageModel


def test_rows_alternate_extraction_and_tool_calls_on_the_functions_source():
    rows = suite_rows(4, tasks=("structured",))
    assert [row.id for row in rows] == [f"structured-0{i}" for i in range(4)]
    assert [sorted(row.request) for row in rows[:2]] == [
        ["response_format"],
        ["parallel_tool_calls", "tool_choice", "tools"],
    ]
    for row in rows:
        assert "```python" in row.messages[0]["content"]
    messages, grammar = constraint(rows[1].messages, rows[1].request)
    assert messages[0]["role"] == "system" and "rename_parameter" in messages[0]["content"]
    assert grammar is not None and constraint(rows[0].messages, None)[1] is None


def test_valid_checks_answers_against_their_schema():
    extraction = suite_rows(2, tasks=("structured",))[0].request
    good = {"function": "f", "module": "m", "parameters": ["x"], "raises": [], "summary": "s"}
    assert matches_schema(json.dumps(good), extraction) is True
    assert matches_schema(json.dumps({**good, "extra": 1}), extraction) is False
    assert matches_schema('{"function": "f"', extraction) is False
    tools = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    args = {"module": "m", "symbol": "s"}
    call = {"tool_calls": [{"name": "find_usages", "arguments": args}]}
    assert matches_schema(json.dumps(call, separators=(", ", ": ")), tools) is True
    wrong = {"tool_calls": [{"name": "find_usages", "arguments": {**args, "extra": 1}}]}
    assert matches_schema(json.dumps(wrong), tools) is False
    messages, fields = server_request([{"role": "user", "content": "x"}], tools)
    assert messages[0]["role"] == "system" and set(fields) == {"response_format"}
    assert server_request(messages, None) == (messages, {})
    assert matches_schema("free text", None) is None


@pytest.fixture(scope="module")
def ascii_lm():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    model = tiny_llama(vocab_size=AsciiTokenizer.vocab_size, seed=2, context=2048)
    return LanguageModel(TorchTarget(model), AsciiTokenizer(), name="tiny", model=model)


def test_a_structured_run_is_valid_and_identical_across_plain_none_and_promptlookup(ascii_lm):
    small = {**EXTRACTION, "properties": {**EXTRACTION["properties"]}}
    small["properties"]["summary"] = {"type": "string", "maxLength": 20}
    for key in ("function", "module"):
        small["properties"][key] = {"enum": ["fn", "mod"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": small}}
    tools = {"tools": TOOLS[2:], "tool_choice": "required", "parallel_tool_calls": False}
    rows = [
        BenchRow("structured", "a", [{"role": "user", "content": "fn in mod"}], request=request)
        for request in ({"response_format": response_format}, tools)
    ]
    result = run_bench(
        ascii_lm,
        rows,
        ["plain", "promptlookup-none", "promptlookup"],
        Settings(max_new_tokens=400),
        warmup=False,
    )
    assert all(record["valid"] for record in result.records), [
        (r["method"], r["text"]) for r in result.records
    ]
    assert all(record["identical_to_plain"] for record in result.records)
    assert all(record["identical_to_none"] for record in result.records)
    (summary,) = [s for s in result.summary if s["method"] == "promptlookup"]
    assert summary["valid_fraction"] == 1.0


@pytest.mark.parametrize("method", ["hf-pld", "hf-custom:k=4"])
def test_transformers_prompt_lookup_is_refused_on_constrained_rows(tmp_path, method):
    """Its drafts bypass the grammar's logits processor (it crashed in llguidance); the
    structured task's default methods leave it out."""
    from click.testing import CliRunner

    from promptlookup.bench.race import CONSTRAINED_METHODS
    from promptlookup.cli import main

    result = CliRunner().invoke(
        main,
        ["bench", "--tasks", "structured", "--limit", "1", "--methods", f"{method},promptlookup",
         "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 2 and "cannot keep to a grammar" in result.output
    assert "hf-" not in CONSTRAINED_METHODS
