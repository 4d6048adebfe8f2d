"""The agents' conformance check (benchmarks/agents, ``make test-agents``), its pure parts:
reading request and answer bodies without keeping their text, the recording proxy in front of
a stand-in server, the report, the agents' config files and the task's repository. Offline: no
npm, no agent, no model."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.agents import agents, report, task  # noqa: E402
from benchmarks.agents.accounting import (  # noqa: E402
    AnswerShape,
    EventReader,
    answer_shape,
    api_of,
    request_shape,
)
from benchmarks.agents.proxy import Recorder, start_proxy  # noqa: E402

SECRET = "the agent's own prompt text"


def sse(*events: dict | str) -> bytes:
    """Server-sent events: dicts as data lines, strings as they are (comments, [DONE])."""
    out = b""
    for event in events:
        line = event if isinstance(event, str) else "data: " + json.dumps(event)
        out += line.encode() + b"\n\n"
    return out


CHAT_STREAM = sse(
    ": keep-alive",
    {"choices": [{"delta": {"role": "assistant"}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {
        "name": "read_file", "arguments": ""}}]}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
        "arguments": '{"path": "calc.py"}'}}]}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 12,
                              "prompt_tokens_details": {"cached_tokens": 950}}},
    "data: [DONE]",
)  # fmt: skip
MESSAGES_STREAM = sse(
    {"type": "message_start", "message": {"usage": {
        "input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}},
    {"type": "content_block_delta", "index": 0, "delta": {
        "type": "input_json_delta", "partial_json": '{"command": "ls"}'}},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
)  # fmt: skip
RESPONSES_STREAM = sse(
    {"type": "response.created", "response": {"status": "in_progress"}},
    {"type": "response.output_item.done", "item": {
        "type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "exec_command",
        "arguments": '{"cmd": "cat calc.py"}'}},
    {"type": "response.completed", "response": {"status": "completed", "output": [], "usage": {
        "input_tokens": 6228, "output_tokens": 20,
        "input_tokens_details": {"cached_tokens": 6000}}}},
)  # fmt: skip


def test_generation_endpoints_are_turns_and_the_rest_are_not():
    assert api_of("/v1/chat/completions") == "chat"
    assert api_of("/v1/messages?beta=true") == "messages"
    assert api_of("/v1/responses") == "responses"
    assert api_of("/v1/messages/count_tokens") is None and api_of("/v1/models") is None


def test_request_shapes_count_tools_and_results_of_each_api_without_text():
    chat = request_shape("chat", json.dumps({
        "model": "m", "stream": True,
        "messages": [{"role": "system", "content": SECRET},
                     {"role": "tool", "tool_call_id": "call_1", "content": SECRET}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }).encode())  # fmt: skip
    assert (chat.model, chat.stream, chat.messages, chat.tools) == ("m", True, 2, 1)
    assert chat.tool_result_ids == ["call_1"] and chat.tool_types == {"function": 1}
    messages = request_shape("messages", json.dumps({
        "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": SECRET, "is_error": True},
            {"type": "text", "text": SECRET}]}],
        "tools": [{"name": "Bash", "input_schema": {}}, {"type": "web_search_20250305"}],
    }).encode())  # fmt: skip
    assert messages.tool_result_ids == ["toolu_1"] and messages.tool_errors == 1
    assert messages.tool_types == {"function": 1, "web_search_20250305": 1}
    responses = request_shape("responses", json.dumps({
        "input": [{"role": "user", "content": SECRET},
                  {"type": "function_call_output", "call_id": "call_9", "output": SECRET},
                  {"type": "custom_tool_call_output", "call_id": "call_8", "output": SECRET}],
        "tools": [{"type": "function"}, {"type": "web_search"}, {"type": "namespace"}],
    }).encode())  # fmt: skip
    assert responses.messages == 3 and responses.tool_result_ids == ["call_9", "call_8"]
    for shape in (chat, messages, responses):
        assert SECRET not in json.dumps(vars(shape))
    assert request_shape("chat", b"not json").body_bytes == 8


def test_answers_give_usage_tool_calls_and_keepalives_per_api():
    chat = answer_shape("chat", 200, "text/event-stream", CHAT_STREAM)
    assert (chat.prompt_tokens, chat.cached_tokens, chat.completion_tokens) == (1000, 950, 12)
    assert chat.tool_calls == {"call_1": "read_file"} and chat.finish == "tool_calls"
    assert chat.keepalives == 1 and chat.events == 4
    messages = answer_shape("messages", 200, "text/event-stream", MESSAGES_STREAM)
    assert (messages.prompt_tokens, messages.cached_tokens) == (1000, 900)
    assert messages.completion_tokens == 9 and messages.tool_calls == {"toolu_1": "Bash"}
    assert messages.finish == "tool_use" and messages.keepalives == 1
    responses = answer_shape("responses", 200, "text/event-stream", RESPONSES_STREAM)
    assert (responses.prompt_tokens, responses.cached_tokens) == (6228, 6000)
    assert responses.tool_calls == {"call_9": "exec_command"} and responses.finish == "completed"


def test_whole_answers_and_errors_are_read_too():
    whole = json.dumps({"object": "chat.completion", "choices": [{"message": {"tool_calls": [
        {"id": "c", "function": {"name": "f"}}]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()  # fmt: skip
    answer = answer_shape("chat", 200, "application/json", whole)
    assert answer.tool_calls == {"c": "f"} and answer.cached_tokens is None
    llama = json.dumps({"choices": [], "usage": {"prompt_tokens": 9}, "timings": {"cache_n": 7}})
    assert answer_shape("chat", 200, "application/json", llama.encode()).cached_tokens == 7
    message = json.dumps({"type": "message", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "t", "name": "Read"}, {"type": "text", "text": "x"}],
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 0}}).encode()  # fmt: skip
    assert answer_shape("messages", 200, "application/json", message).tool_calls == {"t": "Read"}
    refused = {"error": {"message": "tools.4.type: Input should be 'function'"}}
    answer = answer_shape("responses", 400, "application/json", json.dumps(refused).encode())
    assert answer.error == "tools.4.type: Input should be 'function'"
    assert answer_shape("chat", 500, "text/plain", b"boom").error == "boom"
    failed = sse({"type": "error", "error": {"type": "overloaded", "message": "grammar failed"}})
    assert answer_shape("messages", 200, "text/event-stream", failed).error == "grammar failed"


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_events_split_anywhere_read_the_same(size):
    whole = answer_shape("chat", 200, "text/event-stream", CHAT_STREAM)
    pieces = AnswerShape()
    reader = EventReader("chat", pieces)
    for start in range(0, len(CHAT_STREAM), size):
        reader.feed(CHAT_STREAM[start : start + size])
    reader.close()
    assert vars(pieces) == vars(whole)


class StandIn(BaseHTTPRequestHandler):
    """A stand-in server: a stream on /v1/chat/completions, a 400 on /v1/responses."""

    protocol_version = "HTTP/1.1"
    seen: list = []
    arrived, departed = threading.Event(), threading.Event()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandIn.seen.append((self.path, body, self.headers.get("Authorization")))
        if self.headers.get("X-Stall"):  # a long prefill: no answer until the client leaves
            StandIn.arrived.set()
            StandIn.departed.set() if self.rfile.read(1) == b"" else None
            return
        if self.path == "/v1/responses":
            data, kind, status = b'{"error": {"message": "bad tools"}}', "application/json", 400
        else:
            data, kind, status = CHAT_STREAM, "text/event-stream", 200
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("X-Promptlookup-Ignored-Fields", "metadata")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def proxied(tmp_path):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    recorder = Recorder(tmp_path / "requests.jsonl")
    proxy = start_proxy(("127.0.0.1", upstream.server_address[1]), recorder)
    yield proxy.server_address[1], recorder, tmp_path / "requests.jsonl"
    proxy.shutdown()
    upstream.shutdown()


def post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", path, json.dumps(body), {"Authorization": "Bearer k"})
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    return answer.status, data


def test_the_proxy_forwards_unchanged_and_records_no_text(proxied):
    port, recorder, path = proxied
    recorder.agent = "promptlookup/qwen-code"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": SECRET}]}
    assert post(port, "/v1/chat/completions", body) == (200, CHAT_STREAM)
    assert StandIn.seen[-1] == ("/v1/chat/completions", json.dumps(body).encode(), "Bearer k")
    recorder.agent = "promptlookup/codex"
    status, data = post(port, "/v1/responses", {"input": [], "tools": [{"type": "web_search"}]})
    assert (status, json.loads(data)) == (400, {"error": {"message": "bad tools"}})
    assert recorder.wait(2)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["agent"] == "promptlookup/qwen-code" and first["status"] == 200
    assert first["answer"]["cached_tokens"] == 950 and first["request"]["messages"] == 1
    assert second["answer"]["error"] == "bad tools" and second["api"] == "responses"
    assert first["ignored"] == {"x-promptlookup-ignored-fields": "metadata"}
    assert SECRET not in path.read_text() and "calc.py" not in path.read_text()
    assert recorder.turns("promptlookup/qwen-code") == 1  # a refused request is no turn
    assert recorder.turns("promptlookup/codex") == 0


def test_a_client_that_leaves_before_the_answer_cancels_it_upstream(proxied):
    port, recorder, _ = proxied
    recorder.agent = "promptlookup/qwen-code"
    body = b'{"model": "m", "messages": []}'
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Stall: 1\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert StandIn.arrived.wait(30)  # the request is upstream, unanswered
    assert StandIn.departed.wait(30), "the stand-in server never saw the client leave"
    assert recorder.wait(1)
    (record,) = recorder.records
    assert (record["status"], record["client_closed"]) == (499, True)


def turn(status, calls=None, results=(), prompt=None, cached=None, seconds=1.0, error=None):
    return {
        "agent": "promptlookup/claude-code", "api": "messages", "status": status,
        "seconds": seconds, "request": {"tool_result_ids": list(results)},
        "answer": {"tool_calls": calls or {}, "prompt_tokens": prompt, "cached_tokens": cached,
                   "error": error},
    }  # fmt: skip


def test_the_report_counts_executed_calls_cached_shares_and_failures():
    records = [
        turn(400, error="messages.1.role: Input should be 'user' or 'assistant'", seconds=0.1),
        turn(200, {"t1": "Read"}, prompt=20000, cached=0, seconds=40.0),
        turn(200, {"t2": "Edit", "t3": "Bash"}, ["t1"], prompt=20300, cached=20000, seconds=4.0),
        turn(200, {}, ["t1", "t2"], prompt=20600, cached=20500, seconds=3.0),
        {"agent": "promptlookup/claude-code", "api": None, "status": 200},  # count_tokens
    ]
    run = {"server": "promptlookup", "agent": "claude-code", "tests_pass": True,
           "stopped": "exit", "exit_code": 0}  # fmt: skip
    (row,) = report.build(records, [run])
    assert row["requests"] == 5 and row["statuses"] == {"200": 4, "400": 1}
    assert (row["turns"], row["turns_ok"], row["failed_requests"]) == (4, 3, 1)
    assert (row["tool_calls_made"], row["tool_calls_executed"]) == (3, 2)
    assert row["tools_executed"] == {"Read": 1, "Edit": 1}
    assert row["cached_share_later_turns"] == round(20000 / 20300, 3)
    assert row["mean_seconds_per_turn"] == round(47.0 / 3, 2)
    table = report.markdown([row], {"claude-code": "2.1.332"})
    assert "| promptlookup | claude-code 2.1.332 |" in table and "1 × 400" in table
    assert "| - 0 20000 20500 |" in table and "messages.1.role" in table


def test_a_turn_the_client_closed_after_its_final_event_is_answered(tmp_path):
    """Codex closes a stream once it has ``response.completed``: the turn is answered; one
    closed before its final event is not."""
    after = {**turn(200, prompt=9000, cached=0), "client_closed": True}
    after["answer"]["finish"] = "completed"
    before = {**turn(200, prompt=9000, cached=0), "client_closed": True}
    run = {"server": "promptlookup", "agent": "claude-code", "stopped": "exit", "exit_code": 0}
    (row,) = report.build([after, before], [run])
    assert (row["turns"], row["turns_ok"]) == (2, 1)
    assert [t["answered"] for t in row["per_turn"]] == [True, False]
    # The report written again from a run folder's records reads them the same way.
    report.write(tmp_path, report.build([], [run]), {}, {"model": "gemma-3-270m"})
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [after]))
    assert "| 1 | 1 × 200 | 1/1 |" in report.rebuild(tmp_path).read_text()


def test_report_files(tmp_path):
    run = {"server": "promptlookup", "agent": "codex", "stopped": "exit", "exit_code": 1}
    rows = report.build([], [run])
    path = report.write(tmp_path, rows, {"codex": "0.171.0"}, {"model": "gemma-3-270m"})
    assert "| promptlookup | codex 0.171.0 | exit 1 | 0 |" in path.read_text()
    assert json.loads((tmp_path / "report.json").read_text())["rows"][0]["turns"] == 0


def test_each_agent_is_configured_inside_its_own_home(tmp_path):
    bin_dir, base = tmp_path / "bin", "http://127.0.0.1:9999"
    launches = {}
    for name, launcher in agents.LAUNCHERS.items():
        home, repo = tmp_path / name / "home", tmp_path / name / "repo"
        home.mkdir(parents=True)
        launches[name] = launch = launcher(bin_dir, base, home, repo, "fix it", 5)
        assert launch.env["HOME"] == str(home) and launch.cwd == repo
        assert launch.argv[0].startswith(str(bin_dir)) and "fix it" in launch.argv
        written = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert all(str(p).startswith(str(tmp_path / name)) or name not in str(p) for p in written)
    claude = launches["claude-code"]
    assert claude.env["ANTHROPIC_BASE_URL"] == base
    assert claude.env["ANTHROPIC_MODEL"] == agents.MODEL_NAME and "--max-turns" in claude.argv
    config = tomllib.loads((tmp_path / "codex/home/.codex/config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"] == base + "/v1"
    assert "web_search" not in config and "features" not in config  # Codex's defaults
    qwen = launches["qwen-code"]
    assert qwen.env["OPENAI_BASE_URL"] == base + "/v1" and "--max-session-turns" in qwen.argv
    settings = json.loads((tmp_path / "qwen-code/home/.qwen/settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "openai"
    opencode = json.loads(Path(launches["opencode"].env["OPENCODE_CONFIG"]).read_text())
    provider = opencode["provider"]["promptlookup"]
    assert provider["options"]["baseURL"] == base + "/v1"
    assert opencode["model"] == f"promptlookup/{agents.MODEL_NAME}"
    assert opencode["agent"]["build"]["steps"] == 5
    assert agents.npm_specs()[0] == "@anthropic-ai/claude-code@2.1.332"


def test_the_task_fails_until_calc_is_fixed(tmp_path):
    repo = task.make_repo(tmp_path / "repo")
    assert task.outcome(repo) == {"tests_pass": False, "changed": []}
    calc = repo / "calc.py"
    calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
    assert task.outcome(repo) == {"tests_pass": True, "changed": ["calc.py"]}
