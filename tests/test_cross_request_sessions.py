"""The session workload (:mod:`promptlookup.bench.sessions`): built from the installed standard
library at run time, every kind's requests well formed, and a run on a tiny model whose
outputs with the index equal those without."""

from __future__ import annotations

import pytest
from conftest import TinyTokenizer, tiny_llama

import promptlookup
from promptlookup.bench.sessions import cross_request, workload


@pytest.fixture(scope="module")
def long_tiny_lm():
    """A tiny model with room for the workload's prompts (one character per token)."""
    model = tiny_llama(seed=4)
    model.config.max_position_embeddings = 4096
    return promptlookup.from_transformers(model, TinyTokenizer(32), name="tiny-long")


def test_sessions_are_built_from_the_standard_library():
    functions = workload.stdlib_functions()
    assert len(functions) >= 20 and all(f.source.startswith("def ") for f in functions)
    built = workload.build_sessions(per_kind=2, requests=3)
    assert [s.kind for s in built] == [k for k in workload.KINDS for _ in range(2)]
    assert len({s.name for s in built}) == len(built)
    for session in built:
        for step in range(3):
            messages = session.messages(step)
            assert messages and all(m["content"] for m in messages)
            session.answers.append("<tool_call>{}</tool_call>")
    agent = next(s for s in built if s.kind == "agent")
    assert sum(m["role"] == "assistant" for m in agent.messages(3)) == 2  # the last two turns


def test_a_run_on_a_tiny_model_keeps_every_output(long_tiny_lm):
    tiny_lm = long_tiny_lm
    built = workload.build_sessions(("extraction", "agent"), per_kind=1, requests=2)
    run = cross_request.run_sessions(
        tiny_lm, built, max_new_tokens=12, requests=2, log=lambda _: None
    )
    assert run.identical and run.mismatches == []
    assert run.tallies[("all", "off")].requests == 4
    assert run.tallies[("all", "global")].new_tokens == run.tallies[("all", "off")].new_tokens
    assert run.index_tokens["global"] > 0
    table = cross_request.report(run)
    assert "| all | global |" in table and "identical" in table
    pair = workload.build_sessions(("extraction",), per_kind=2, requests=2)
    batched = cross_request.run_sessions(
        tiny_lm, pair, max_new_tokens=12, requests=2, concurrency=2, log=lambda _: None
    )
    assert batched.identical and batched.tallies[("all", "per-tenant")].requests == 4


class EchoServer:
    """A stand-in for an OpenAI-compatible server: answers with the text ``answers`` maps the
    last message to (what the local model answered), or something else."""

    name = "echo"

    def __init__(self, lm) -> None:
        self.lm, self.answers, self.seen = lm, {}, []

    def run_chat(self, messages, settings):
        from promptlookup.bench.methods import MethodOutput

        self.seen.append((messages, settings.max_new_tokens, settings.temperature))
        prompt_ids = tuple(self.lm.encode(messages))
        text = self.answers.get(prompt_ids, "something else")
        return MethodOutput([], 0.01, token_seconds=[0.005, 0.01], text=text, new_tokens=2)


def test_a_server_is_one_more_mode_with_its_texts_compared(long_tiny_lm, monkeypatch):
    server = EchoServer(long_tiny_lm)
    real = cross_request._generate

    def remember(lm, prompts, indexes, max_new_tokens):  # the off answers, for the server
        outputs = real(lm, prompts, indexes, max_new_tokens)
        for prompt, output in zip(prompts, outputs):
            if indexes[0] is None:
                server.answers[tuple(lm.encode(prompt))] = output.text
        return outputs

    monkeypatch.setattr(cross_request, "_generate", remember)
    built = workload.build_sessions(("extraction", "file_edits"), per_kind=1, requests=2)
    run = cross_request.run_sessions(
        long_tiny_lm, built, max_new_tokens=12, requests=2, servers=[server], log=lambda _: None
    )
    assert run.identical  # a server's text never counts as a mismatch
    assert len(server.seen) == 4 and all(s[1:] == (12, 0.0) for s in server.seen)
    assert run.tallies[("all", "echo")].requests == 4
    assert run.tallies[("all", "echo")].new_tokens == 8
    # Modes rotate: the server answered some requests before the off mode had, so those
    # texts were not yet known to it.
    assert 0 < run.same_text["echo"] < 4
    table = cross_request.report(run)
    assert "| all | echo | 4 | 8 | - | - |" in table
    assert f"echo: {run.same_text['echo']} of 4 answers the same text" in table
