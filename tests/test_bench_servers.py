"""``promptlookup bench --against NAME=URL``: OpenAI-compatible servers raced with the local
methods in the same tables, through an in-process fake server over the tiny model (streamed
chunks, usage, a server that refuses llama-server's ``cache_prompt``), and the memory column."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from promptlookup.bench import BenchRow, Settings, read_results, run_bench
from promptlookup.bench.memory import PeakMeter, peak_rss_mib, weights_format
from promptlookup.bench.methods import get_backend
from promptlookup.bench.report import console_tables
from promptlookup.bench.servers import ServerError, ServerMethod, parse_against
from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError

ROWS = [
    BenchRow("t", f"p{i}", [{"role": "user", "content": text}])
    for i, text in enumerate(["abcabcabd abcabcabd abcab", "xyzxyz qxyz xyzx"])
]
SETTINGS = Settings(max_new_tokens=12)


class FakeOpenAI:
    """An OpenAI-compatible server in a thread: greedy plain decoding of the tiny model,
    streamed in chunks of ``chunk`` tokens, with usage; ``strict`` refuses unknown fields as
    ``promptlookup serve`` does."""

    def __init__(self, lm, chunk: int = 2, strict: bool = False, shift: bool = False) -> None:
        self.lm, self.chunk, self.strict, self.shift = lm, chunk, strict, shift
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                fake.send(self, 200, {"object": "list", "data": [{"id": "tiny-served"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.strict and "cache_prompt" in body:
                    fake.send(self, 400, {"error": {"message": "unknown field cache_prompt"}})
                    return
                fake.stream(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @staticmethod
    def send(handler, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def stream(self, handler, body: dict) -> None:
        result = self.lm.generate(
            body["messages"], max_new_tokens=body["max_tokens"], drafter="none"
        )
        ids = [t for t in result.token_ids if t not in self.lm.eos_token_ids]
        if self.shift:  # a different model: other text
            ids = [1 + (t % 30) for t in ids]
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        for start in range(0, len(ids), self.chunk):
            text = self.lm.tokenizer.decode(ids[start : start + self.chunk])
            event = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            handler.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            handler.wfile.flush()
        usage = {"choices": [], "usage": {"completion_tokens": len(result.token_ids)}}
        handler.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def __enter__(self) -> FakeOpenAI:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_server_is_raced_in_the_same_rows_and_tables(tiny_lm):
    with FakeOpenAI(tiny_lm, chunk=3) as fake, FakeOpenAI(tiny_lm, shift=True) as other:
        servers = [
            ServerMethod("fake", fake.url, tiny_lm),
            ServerMethod("other", other.url, tiny_lm),
        ]
        result = run_bench(tiny_lm, ROWS, ["plain", "promptlookup", *servers], SETTINGS)
    rows = {(r["method"], r["id"]): r for r in result.records}
    for row_id in ("p0", "p1"):
        served, plain = rows[("fake", row_id)], rows[("plain", row_id)]
        assert served["identical_to_plain"] is True and served["text"] == plain["text"]
        assert served["new_tokens"] == plain["new_tokens"]  # from the server's usage
        assert served["forward_passes"] is None and served["seconds"] > 0
        assert len(served["token_seconds"]) == len(served["token_ids"])
        assert served["token_seconds"] == sorted(served["token_seconds"])
        assert rows[("other", row_id)]["identical_to_plain"] is False
    # The same request shape for every prompt: greedy, streamed with usage, max tokens.
    body = fake.bodies[-1]
    assert body["model"] == "tiny-served" and body["temperature"] == 0.0
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 12 and body["cache_prompt"] is False
    assert len(fake.bodies) == 1 + len(ROWS)  # the warm-up, then one per prompt
    summary = {(r["task"], r["method"]): r for r in result.summary}
    assert (
        summary[("t", "fake")]["speedup"] > 0 and summary[("t", "fake")]["identical_fraction"] == 1
    )
    assert "fake" in console_tables(result.records, result.summary)


def test_methods_alternate_with_servers_in_the_balanced_order(tiny_lm):
    order = []
    with FakeOpenAI(tiny_lm) as fake:
        server = ServerMethod("fake", fake.url, tiny_lm)
        real = server.run_chat
        server.run_chat = lambda messages, settings: (
            order.append("fake") or real(messages, settings)
        )
        run_bench(tiny_lm, ROWS, ["plain", server], SETTINGS, warmup=False)
    assert len(order) == len(ROWS)


def test_a_server_that_refuses_cache_prompt_gets_requests_without_it(tiny_lm):
    with FakeOpenAI(tiny_lm, strict=True) as fake:
        server = ServerMethod("strict", fake.url, tiny_lm)
        result = run_bench(tiny_lm, ROWS[:1], ["plain", server], SETTINGS, warmup=False)
    assert [("cache_prompt" in b) for b in fake.bodies] == [True, False]
    assert all(r["identical_to_plain"] for r in result.records)


def test_a_refused_cache_prompt_is_retried_when_a_concurrent_request_dropped_it_first(tiny_lm):
    with FakeOpenAI(tiny_lm, strict=True) as fake:
        server = ServerMethod("strict", fake.url, tiny_lm)
        real = server._stream

        def racing(body):
            answer = real(body)
            server._extra = {}  # another request's refusal, handled in the meantime
            return answer

        server._stream = racing
        output = server.run_chat([{"role": "user", "content": "abc"}], SETTINGS)
    assert output.text and [("cache_prompt" in b) for b in fake.bodies] == [True, False]


def test_cli_against_reports_the_server_and_its_process(tiny_lm, monkeypatch, tmp_path):
    monkeypatch.setattr(get_backend("torch"), "load", lambda *args: tiny_lm)
    data = tmp_path / "d.jsonl"
    data.write_text(
        "\n".join(json.dumps({"id": r.id, "task": "t", "messages": r.messages}) for r in ROWS)
    )
    out = tmp_path / "out"
    with FakeOpenAI(tiny_lm) as fake:
        result = CliRunner().invoke(
            main,
            ["bench", "--no-progress", "--data", str(data), "-n", "6", "--methods", "plain"]
            + ["--against", f"served={fake.url}/v1", "--out", str(out)],
        )
    assert result.exit_code == 0, result.output
    assert "served" in result.output and "peak RSS MiB" in result.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["against"]["served"]["model"] == "tiny-served"
    assert meta["against"]["served"]["url"] == fake.url
    records = read_results(out / "results.jsonl")
    assert {r["method"] for r in records} == {"plain", "served"}
    pytest.importorskip("psutil")  # the server (this process) found from its port
    assert meta["against"]["served"]["pid"] is not None
    assert all(r["peak_rss_mib"] for r in records)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--against", "nourl"], "expected NAME=URL"),
        (["--against", "plain=http://127.0.0.1:9"], "a method of that name already runs"),
        (["--against", "gone=http://127.0.0.1:9"], "gone: cannot reach http://127.0.0.1:9"),
    ],
)
def test_bad_servers_fail_with_one_line_before_the_model_loads(tiny_lm, monkeypatch, args, message):
    loads = []
    monkeypatch.setattr(get_backend("torch"), "load", lambda *a: loads.append(1) or tiny_lm)
    result = CliRunner().invoke(main, ["bench", "--no-progress", "--quick", *args, "--out", "x"])
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and not loads


def test_parse_against_and_server_errors():
    assert parse_against("a=https://host/v1") == ("a", "https://host")
    with pytest.raises(InvalidParameterError):
        parse_against("a=ftp://host")
    assert issubclass(ServerError, InvalidParameterError)


# -- memory and weights ---------------------------------------------------------------------


def test_peak_rss_is_measured_per_generation():
    if peak_rss_mib() is None:
        pytest.skip("no /proc/self/status here")
    meter = PeakMeter()
    meter.start()
    block = bytearray(64 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    high = meter.stop()
    del block
    meter.start()
    low = meter.stop()
    if low is not None:  # the kernel lets this process reset its mark
        assert high - low > 50


def test_weights_format_comes_from_the_target_or_the_parameters(tiny_lm):
    assert "float32" in weights_format(tiny_lm)
    bare = SimpleNamespace(target=SimpleNamespace(), model=tiny_lm.model)
    assert weights_format(bare) == "float32 weights and activations (torch)"
    gguf = SimpleNamespace(model=SimpleNamespace(metadata={"general.file_type": "3"}))
    assert weights_format(gguf) == "Q4_1 GGUF, run by llama.cpp"


def test_memory_column_and_weights_reach_the_report(tiny_lm, tmp_path):
    result = run_bench(tiny_lm, ROWS[:1], ["plain"], SETTINGS, out_dir=tmp_path, warmup=False)
    report = (tmp_path / "report.md").read_text()
    assert f"weights: {weights_format(tiny_lm)}" in report
    if result.records[0]["peak_rss_mib"] is not None:
        assert "peak RSS MiB" in report and result.summary[0]["peak_rss_mib"] > 10
