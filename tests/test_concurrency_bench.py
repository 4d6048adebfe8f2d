"""The concurrency benchmark (benchmarks/concurrency.py) summarizes what it measured: offline,
on synthetic records, no servers."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "concurrency.py"
spec = importlib.util.spec_from_file_location("concurrency_bench", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def record(
    method,
    concurrency,
    request,
    text,
    *,
    repeat=0,
    tokens=10,
    ttft=0.1,
    itl=0.02,
    latency=0.3,
    error=None,
):
    return {
        "method": method,
        "concurrency": concurrency,
        "request": request,
        "repeat": repeat,
        "text": text,
        "completion_tokens": tokens,
        "ttft": ttft,
        "itl": itl,
        "latency": latency,
        "error": error,
    }


def test_identical_counts_compare_with_the_same_method_at_the_lowest_level():
    records = [
        record("a", 1, 0, "x"),
        record("a", 1, 1, "y"),
        record("a", 4, 0, "x"),
        record("a", 4, 1, "y!"),  # request 1 changed
        record("b", 1, 0, "x!"),
        record("b", 1, 1, "y"),
        record("b", 4, 0, "x!"),
        record("b", 4, 1, "y"),  # b's own level 1, not a's
    ]
    counts = bench.identical_counts(records)
    assert counts == {("a", 1): (2, 2), ("a", 4): (1, 2), ("b", 1): (2, 2), ("b", 4): (2, 2)}


def test_identical_counts_treat_failures_as_different_and_use_the_first_repeat():
    records = [
        record("a", 2, 0, "x"),
        record("a", 2, 1, "", error="HTTP 500"),  # lowest level is 2
        record("a", 8, 0, "x"),
        record("a", 8, 1, ""),  # its reference failed
        record("a", 2, 0, "x2", repeat=1),
        record("a", 2, 1, "", repeat=1),
        record("a", 8, 0, "x", repeat=1, error="timeout"),
        record("a", 8, 1, "", repeat=1),
    ]
    counts = bench.identical_counts(records)
    # level 2: repeat 0 request 0 matches itself; repeat 1's "x2" differs from repeat 0's "x"
    assert counts[("a", 2)] == (1, 4)
    # level 8: request 0 matches once (the other run failed), request 1's reference failed
    assert counts[("a", 8)] == (1, 4)


def test_level_result_counts_only_successful_tokens_over_wall_time():
    records = [
        record("a", 2, 0, "x", tokens=30),
        record("a", 2, 1, "y", tokens=10),
        record("a", 2, 2, "", tokens=99, error="HTTP 429"),
    ]
    level = bench.level_result("a", 0, 2, 4.0, records)
    assert level["completion_tokens"] == 40
    assert level["tokens_per_second"] == 10.0


def test_summary_speedup_medians_and_order():
    levels = [
        bench.level_result("m", r, c, wall, [record("m", c, 0, "t", tokens=100)])
        for r, c, wall in [
            (0, 1, 10.0),
            (1, 1, 5.0),
            (2, 1, 2.5),  # 10, 20, 40 tok/s
            (0, 4, 2.0),
            (1, 4, 2.5),
            (2, 4, 20.0),
        ]
    ]  # 50, 40, 5 tok/s
    records = [
        record("m", 1, 0, "t", ttft=0.1, itl=0.01, latency=1.0),
        record("m", 1, 1, "u", ttft=0.3, itl=0.03, latency=3.0),
        record("m", 4, 0, "t", ttft=0.5, itl=0.05, latency=2.0),
        record("m", 4, 1, "v", ttft=0.7, itl=0.07, latency=4.0),
        record("m", 4, 2, "", ttft=None, itl=None, latency=9.0, error="boom"),
    ]
    rows = bench.summarize(levels, records)
    assert [(row["method"], row["concurrency"]) for row in rows] == [("m", 1), ("m", 4)]
    one, four = rows
    assert one["tokens_per_second"] == 20.0 and sorted(one["tokens_per_second_runs"]) == [
        10,
        20,
        40,
    ]
    assert four["tokens_per_second"] == 40.0
    assert one["speedup"] == 1.0 and four["speedup"] == 2.0
    assert one["ttft_p50"] == pytest.approx(0.2) and one["itl_p50"] == pytest.approx(0.02)
    assert four["latency_p50"] == pytest.approx(3.0)  # the failed request is left out
    assert (four["identical"], four["requests"], four["errors"]) == (1, 3, 1)


def test_markdown_table_rows_and_units():
    rows = [
        {
            "method": "llama-server",
            "concurrency": 1,
            "tokens_per_second": 51.234,
            "speedup": 1.0,
            "ttft_p50": 0.1234,
            "itl_p50": 0.0191,
            "latency_p50": 1.0,
            "identical": 8,
            "requests": 8,
        },
        {
            "method": "llama-server",
            "concurrency": 8,
            "tokens_per_second": None,
            "speedup": None,
            "ttft_p50": None,
            "itl_p50": None,
            "latency_p50": None,
            "identical": 0,
            "requests": 8,
        },
    ]
    lines = bench.markdown_table(rows).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| method | concurrency | tokens/s")
    assert lines[2] == "| llama-server | 1 | 51.2 | 1.00x | 123 | 19.1 |  | 8/8 |"
    assert lines[3] == "| llama-server | 8 | n/a | n/a | n/a | n/a |  | 0/8 |"
    rows[1]["speedup_runs"] = [0.91, None]
    assert bench.markdown_table(rows).splitlines()[3].endswith("| 0.91x, n/a | 0/8 |")


def test_speedups_per_repeat_pair_each_level_with_the_lowest_of_its_own_repeat():
    levels = [
        bench.level_result("m", r, c, wall, [record("m", c, 0, "t", tokens=100)])
        for r, c, wall in [(0, 1, 10.0), (0, 8, 5.0), (1, 8, 8.0), (1, 1, 4.0), (2, 1, 1.0)]
    ] + [bench.level_result("other", 0, 2, 1.0, [record("other", 2, 0, "t", tokens=100)])]
    assert bench.repeat_speedups(levels, "m", 8) == [2.0, 0.5, None]  # repeat 2 lacks level 8
    assert bench.repeat_speedups(levels, "m", 1) == [1.0, 1.0, 1.0]
    rows = bench.summarize(levels, [record("m", 1, 0, "t"), record("m", 8, 0, "t")])
    assert rows[1]["speedup_runs"] == [2.0, 0.5, None]


def test_pick_requests_cycles_tasks_in_file_order():
    tasks = ("code_edit", "summarization", "qa", "chat", "open_ended")
    rows = {
        task: [
            SimpleNamespace(
                task=task, id=f"{task}{i}", messages=[{"role": "user", "content": f"{i}"}]
            )
            for i in range(2)
        ]
        for task in tasks
    }
    picked = bench.pick_requests(rows, 8)
    assert [r["id"] for r in picked] == [f"{t}0" for t in tasks] + [f"{t}1" for t in tasks[:3]]
    assert [r["index"] for r in picked] == list(range(8))
    with pytest.raises(ValueError, match="code_edit"):
        bench.pick_requests({**rows, "code_edit": rows["code_edit"][:1]}, 6)
    picked = bench.pick_requests(rows, 4, ("code_edit", "open_ended"))  # --tasks
    assert [r["id"] for r in picked] == ["code_edit0", "open_ended0", "code_edit1", "open_ended1"]


def test_server_commands():
    pl = bench.server_command("promptlookup-none", port=9, model="m.gguf", threads=2, slots=8)
    assert pl[1:4] == ["-m", "promptlookup", "serve"]
    assert pl[pl.index("--max-batch") + 1] == "8" and pl[pl.index("--drafter") + 1] == "none"
    assert "--drafter" not in bench.server_command(
        "promptlookup", port=9, model="m", threads=2, slots=1
    )
    ls = bench.server_command(
        "llama-server",
        port=9,
        model="m.gguf",
        threads=2,
        slots=4,
        llama_server="/bin/llama-server",
        ctx_per_slot=1000,
    )
    assert ls[0] == "/bin/llama-server" and ls[ls.index("-np") + 1] == "4"
    assert ls[ls.index("-c") + 1] == "4000" and ls[ls.index("-t") + 1] == "2"
    assert "--spec-type" not in ls
    ngram = bench.server_command(
        "llama-server-ngram",
        port=9,
        model="m.gguf",
        threads=2,
        slots=4,
        llama_server="/bin/llama-server",
    )
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod"
    assert ngram[ngram.index("--cache-ram") + 1] == "0"
    custom = bench.server_command(
        "llama-server-ngram",
        port=9,
        model="m.gguf",
        threads=2,
        slots=1,
        llama_server="ls",
        spec_args=("--spec-type", "x"),
    )
    assert custom[-2:] == ["--spec-type", "x"] and "ngram-mod" not in custom
    with pytest.raises(ValueError):
        bench.server_command("llama-server", port=9, model="m", threads=2, slots=1)
    extra = bench.server_command(
        "promptlookup",
        port=9,
        model="m",
        threads=2,
        slots=8,
        serve_args=("--prefix-cache-mib", "0"),
    )
    assert extra[-2:] == ["--prefix-cache-mib", "0"]


def test_only_llama_server_gets_cache_prompt():
    assert bench.request_body("llama-server-ngram", "m", [], 16)["cache_prompt"] is False
    body = bench.request_body("promptlookup", "m", [], 16)
    assert "cache_prompt" not in body and body["temperature"] == 0 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_parse_levels():
    assert bench.parse_levels("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "1,100"):
        with pytest.raises(ValueError):
            bench.parse_levels(bad)
