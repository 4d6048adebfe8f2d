"""The bench's multi-turn session mode: each method's turns carry its own earlier answers,
methods rotate turn by turn, the summary counts what was measured, and a server raced there
keeps its prompt cache (no ``cache_prompt: false``) and reports its cached tokens."""

from __future__ import annotations

import json

import pytest
from _server import FIXED, MODEL, RunningServer, tiny_lm
from click.testing import CliRunner

from promptlookup.bench.methods import Settings
from promptlookup.bench.servers import ServerMethod
from promptlookup.bench.sessions.conversations import (
    Conversation,
    ScriptedConversation,
    build_conversations,
    report,
    run_conversations,
    summary,
)
from promptlookup.cli import main
from promptlookup.server import ServerSettings, create_app


class Echo:
    """A method that answers with its name and the number of messages it was sent."""

    def __init__(self, name: str) -> None:
        self.name, self.sent = name, []

    def chat(self, messages, max_tokens):
        self.sent.append(messages)
        return {
            "text": f"{self.name} saw {len(messages)}",
            "first_token_seconds": 0.5 if len(messages) == 1 else 0.1,
            "seconds": 1.0,
            "completion_tokens": 10,
            "prompt_tokens": 100,
            "cached_tokens": None,
        }


def test_each_method_carries_its_own_answers_turn_after_turn():
    methods = [Echo("a"), Echo("b")]
    conversation = Conversation("one", "def f():\n    return 1", ["Rename f", "Add a comment"])
    answered = []
    records = run_conversations(
        methods, [conversation], 3, 8, log=lambda _: None, on_turn=answered.append
    )
    assert answered == records  # each turn handed on as it is answered
    assert [(r.turn, r.method) for r in records] == [
        (1, "a"), (1, "b"), (2, "b"), (2, "a"), (3, "a"), (3, "b"),
    ]  # fmt: skip
    third = methods[1].sent[2]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[1]["content"] == "b saw 1" and third[3]["content"] == "b saw 3"
    assert "def f()" in third[0]["content"] and "Add a comment" in third[2]["content"]
    table = summary(records, ["a", "b"])
    assert table["a"]["tokens_per_second"] == 10.0 and table["a"]["median_ttft_turn_1"] == 0.5
    assert table["a"]["median_ttft_later_turns"] == 0.1 and table["b"]["cached_tokens"] is None
    assert table["b"]["same_text_as_first"] == 0 and table["a"]["same_text_as_first"] == 3
    assert "| a | 3 | 30 | 10.0 | 1.00 |" in report(records, ["a", "b"])


def test_conversations_are_built_from_the_standard_library_alike_each_time():
    first, again = build_conversations(3), build_conversations(3)
    assert first == again and len({c.name for c in first}) == 3
    assert all(len(c.file) >= 3000 for c in first)


def test_a_server_keeps_its_cache_and_reports_the_cached_tokens():
    settings = ServerSettings(model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(tiny_lm(), settings)) as running:
        server = ServerMethod("pl", running.url, keep_cache=True)
        assert "cache_prompt" not in server.body([], Settings(max_new_tokens=4))
        conversation = Conversation("c", "abcdefgh " * 30, ["add", "remove"])
        records = run_conversations([server], [conversation], 2, 8, log=lambda _: None)
    assert records[0].cached_tokens == 0 and records[1].cached_tokens >= 32
    assert records[1].prompt_tokens > records[0].prompt_tokens


def test_the_session_mode_runs_from_the_command_line(tmp_path, monkeypatch):
    from promptlookup.bench.sessions import conversations

    short = [Conversation("short", "abcdefgh " * 20, ["add", "remove"])]
    monkeypatch.setattr(
        conversations, "build_conversations", lambda count, file_chars=None: short * count
    )
    settings = ServerSettings(model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(tiny_lm(), settings)) as running:
        out = tmp_path / "run"
        result = CliRunner().invoke(
            main,
            [
                "bench", "--sessions", "1", "--turns", "2", "--max-new-tokens", "4",
                "--methods", "none", "--against", f"pl={running.url}", "--out", str(out),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = (out / "sessions.jsonl").read_text().splitlines()
    assert [json.loads(line)["turn"] for line in lines] == [1, 2]
    assert "median TTFT turns 2+" in (out / "sessions.md").read_text()


def test_sessions_from_data_replay_its_user_turns_with_each_methods_answers(tmp_path):
    """``--sessions N --data FILE``: the first N rows, each row's user messages its turns (as
    many as it has, up to --turns), its assistant messages replaced by the method's own."""
    rows = [
        {"id": "a", "task": "chat", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "abcabc first"},
            {"role": "assistant", "content": "the data's answer"},
            {"role": "user", "content": "abcabc second"},
            {"role": "assistant", "content": "another"},
            {"role": "user", "content": "abcabc third"},
        ]},
        {"id": "b", "task": "chat", "messages": [{"role": "user", "content": "only one turn"}]},
        {"id": "c", "task": "chat", "messages": [{"role": "user", "content": "not reached"}]},
    ]  # fmt: skip
    data = tmp_path / "talks.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = ServerSettings(model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(tiny_lm(), settings)) as running:
        out = tmp_path / "run"
        result = CliRunner().invoke(
            main,
            [
                "bench", "--sessions", "2", "--turns", "2", "--data", str(data), "-n", "4",
                "--methods", "none", "--against", f"pl={running.url}", "--out", str(out),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    turns = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert [(t["session"], t["turn"]) for t in turns] == [
        ("chat-a", 1),
        ("chat-a", 2),
        ("chat-b", 1),
    ]
    assert turns[1]["cached_tokens"] > 0  # turn 2 starts with turn 1 and its own answer
    talk = ScriptedConversation.of("a", rows[0]["messages"])
    second = talk.messages([turns[0]["text"]])
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == turns[0]["text"] != "the data's answer"


def test_without_methods_the_session_mode_runs_promptlookup_in_process(tmp_path, monkeypatch):
    """README's ``bench --sessions 4 --against ...`` (no --methods) failed: the bench's default
    methods were taken for the session mode's."""
    import promptlookup
    from promptlookup.bench.sessions import conversations

    short = [Conversation("short", "abcdefgh " * 20, ["add", "remove"])]
    monkeypatch.setattr(
        conversations, "build_conversations", lambda count, file_chars=None: short * count
    )
    monkeypatch.setattr(promptlookup, "load_model", lambda *args, **kwargs: tiny_lm())
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["bench", "--sessions", "1", "--turns", "2", "-n", "4", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    methods = {json.loads(line)["method"] for line in (out / "sessions.jsonl").open()}
    assert methods == {"promptlookup"}


def test_the_session_mode_takes_only_promptlookup_in_process(tmp_path):
    result = CliRunner().invoke(
        main, ["bench", "--sessions", "1", "--methods", "plain", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and "--methods is promptlookup" in result.output


def test_long_sessions_take_the_next_modules_up_to_the_characters_asked():
    short, long = build_conversations(2), build_conversations(2, file_chars=20000)
    assert [c.name for c in short] == [c.name for c in long]
    for one, other in zip(short, long, strict=True):
        assert other.file.startswith(one.file) and 20000 <= len(other.file) < 24000


@pytest.mark.parametrize("count", [1, 40])
def test_more_conversations_than_modules_reuse_them(count):
    assert len(build_conversations(count)) == count
