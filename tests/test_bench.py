"""The benchmark command: files and keys, numbers recomputed from what was measured, the
identity check, fairness plumbing (seeds, counters), and one-line errors on bad input."""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from promptlookup.bench import BenchRow, MethodOutput, Settings, load_all, read_results, run_bench
from promptlookup.bench.methods import (
    get_backend,
    make_method,
    parse_method_spec,
    split_methods,
    sweep_specs,
)
from promptlookup.bench.records import ResultRecord
from promptlookup.bench.report import render_markdown
from promptlookup.bench.runner import method_order
from promptlookup.bench.summary import (
    SUMMARY_KEYS,
    after_first_pass,
    best_promptlookup,
    held_out_ratio,
    repeat_spread,
    speedup_parts,
    summarize,
)
from promptlookup.bench.torch_methods import ForwardTrace
from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError, PromptLookupError

TEXTS = ["abcabcabd abcabcabd abcab", "hello world hello world hel", "xyzxyz qxyz xyzx"]
FAST = Settings(max_new_tokens=12)


def rows(n: int = 2, task: str = "t") -> list[BenchRow]:
    return [
        BenchRow(task, f"p{i}", [{"role": "user", "content": TEXTS[i % len(TEXTS)]}])
        for i in range(n)
    ]


def write_jsonl(path: Path, task: str = "edit", n: int = 2) -> Path:
    lines = [
        json.dumps(
            {"id": f"{task}-{i}", "task": task, "messages": [{"role": "user", "content": TEXTS[i]}]}
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_backend(tiny_lm, monkeypatch):
    """The CLI's torch backend, loading the tiny model instead of the default one."""
    backend = get_backend("torch")
    monkeypatch.setattr(backend, "load", lambda model, dtype, device, threads: tiny_lm)
    return tiny_lm


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", "--no-progress", *args])


# -- files, keys and numbers -----------------------------------------------------------------


def test_cli_samples_only_with_sampling_and_checks_its_settings(tiny_backend, tmp_path):
    data = str(write_jsonl(tmp_path / "edit.jsonl", n=1))
    common = ["--data", data, "-n", "6", "--methods", "promptlookup", "--threads", "1"]
    for flags, problem in [
        (["--sampling", "--temperature", "0"], "--sampling needs --temperature > 0"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    ]:
        result = invoke(*common, *flags, "--out", str(tmp_path / "bad"))
        assert result.exit_code == 2 and problem in result.output
    for flags, expected in [
        (["--temperature", "0.5", "--seed", "3"], (0.0, None)),  # ignored without --sampling
        (["--sampling", "--temperature", "0.5", "--seed", "3"], (0.5, 3)),
    ]:
        out = tmp_path / f"run-{len(flags)}"
        assert invoke(*common, *flags, "--out", str(out)).exit_code == 0
        settings = json.loads((out / "meta.json").read_text())["settings"]
        assert (settings["temperature"], settings["seed"]) == expected
        identical = {r["identical_to_plain"] for r in read_results(out / "results.jsonl")}
        assert identical == ({None} if expected[1] is not None else {True})


def test_cli_writes_results_summary_report_and_figures(tiny_backend, tmp_path):
    data = write_jsonl(tmp_path / "edit.jsonl")
    chat = write_jsonl(tmp_path / "chat.jsonl", task="chat", n=1)
    out = tmp_path / "out"
    result = invoke(
        "--data",
        str(data),
        "--data",
        str(chat),
        "--max-new-tokens",
        "10",
        "--methods",
        "hf-pld,promptlookup,promptlookup-none",
        "--threads",
        "1",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    for name in (
        "results.jsonl",
        "summary.json",
        "report.md",
        "meta.json",
        "speedup.png",
        "tokens_per_forward.png",
        "speedup_parts.png",
    ):
        assert (out / name).is_file(), name
    records = read_results(out / "results.jsonl")
    optional = ("repeat_seconds", "valid")  # with repeats; on the structured task
    keys = tuple(f.name for f in dataclasses.fields(ResultRecord) if f.name not in optional)
    assert all(tuple(r) == keys for r in records)
    assert len(records) == 3 * 4  # prompts x methods, plain added as the baseline
    assert [r["method"] for r in records[:4]] == [
        "plain",
        "hf-pld",
        "promptlookup",
        "promptlookup-none",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert all(tuple(row) == SUMMARY_KEYS for row in summary)
    assert {(r["task"], r["method"]) for r in summary} >= {
        ("edit", "hf-pld"),
        ("chat", "plain"),
        ("all", "promptlookup"),
    }
    # Greedy float32: every method reproduces plain decoding exactly.
    assert all(r["identical_to_plain"] is True for r in records)
    report = (out / "report.md").read_text()
    assert "| edit | hf-pld |" in report and "torch threads 1" in report
    assert "hf-pld" in result.output and "speed-up" in result.output  # the table printed
    # The promptlookup speed-up split into the engine's part and drafting's, labelled.
    assert "## What the speed-up is made of" in report and "engine's part" in report
    assert "engine x drafting" in result.output
    parts = {(p["task"], p["method"]): p for p in speedup_parts(summary)}
    speedups = {(r["task"], r["method"]): r["speedup"] for r in summary}
    for task in ("edit", "chat", "all"):
        part = parts[(task, "promptlookup")]
        assert part["engine"] == speedups[(task, "promptlookup-none")]
        assert abs(part["engine"] * part["drafting"] - part["speedup"]) < 0.01


def test_summary_numbers_are_recomputed_from_results(tiny_lm, tmp_path):
    result = run_bench(
        tiny_lm, rows(3), ["plain", "hf-pld", "promptlookup"], FAST, out_dir=tmp_path, warmup=False
    )
    records = read_results(tmp_path / "results.jsonl")
    assert records == result.records
    summary = {
        (r["task"], r["method"]): r for r in json.loads((tmp_path / "summary.json").read_text())
    }
    plain = [r for r in records if r["method"] == "plain"]
    plain_rate = sum(r["new_tokens"] for r in plain) / sum(r["seconds"] for r in plain)
    for method in ("hf-pld", "promptlookup"):
        mine = [r for r in records if r["method"] == method]
        rate = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        row = summary[("t", method)]
        assert row["prompts"] == 3
        assert row["tokens_per_second"] == pytest.approx(rate, abs=1e-3)
        assert row["speedup"] == pytest.approx(rate / plain_rate, abs=1e-4)
        per_prompt = [
            (m["new_tokens"] / m["seconds"]) / (p["new_tokens"] / p["seconds"])
            for m, p in zip(mine, plain)
        ]
        assert row["median_speedup"] == pytest.approx(statistics.median(per_prompt), abs=1e-4)
        assert row["tokens_per_forward"] == pytest.approx(
            sum(r["new_tokens"] for r in mine) / sum(r["forward_passes"] for r in mine), abs=1e-4
        )
        drafted = sum(r["drafted_tokens"] for r in mine)
        if drafted:
            assert row["acceptance_rate"] == pytest.approx(
                sum(r["accepted_tokens"] for r in mine) / drafted, abs=1e-4
            )
    assert summary[("t", "plain")]["speedup"] == 1.0
    assert summary[("t", "plain")]["tokens_per_forward"] == 1.0  # one pass per token

    # The decode measure exists where a method's rows wrote tokens, over some time, after their
    # first pass: a tiny model on an idle machine can write every token within SAME_PASS_GAP
    # of the one before, all in "the first pass". Then it is 1.0 for plain and positive for
    # the others (its rule: the test below), and None otherwise.
    def decodes(rows):
        parts = [after_first_pass(r) for r in rows]
        return (
            all(part is not None for part in parts)
            and sum(t for t, _ in parts) > 0
            and sum(s for _, s in parts) > 0
        )

    plain_decodes = decodes(plain)
    assert summary[("t", "plain")]["decode_speedup"] == (1.0 if plain_decodes else None)
    for method in ("plain", "hf-pld", "promptlookup"):
        mine = [r for r in records if r["method"] == method]
        row = summary[("t", method)]
        assert row["first_token_seconds"] == pytest.approx(
            statistics.median(r["token_seconds"][0] for r in mine), abs=1e-4
        )
        if plain_decodes and decodes(mine):
            assert row["decode_speedup"] is not None and row["decode_speedup"] > 0
        elif not plain_decodes:
            assert row["decode_speedup"] is None


def test_decode_speedup_leaves_out_the_first_pass_and_its_tokens():
    """Two prompts, plain against a method whose first pass (the prefill, here 3 s: slow)
    also yields a drafted token (0.1 ms after the first): over whole requests it is slower, after the first pass it
    writes 2 tokens in 1 s where plain writes 3 in 3 s, so its decode speed-up is 2."""

    def row(method, prompt, times):
        return {
            "task": "t",
            "id": prompt,
            "method": method,
            "new_tokens": len(times),
            "seconds": times[-1],
            "forward_passes": None,
            "drafted_tokens": None,
            "accepted_tokens": None,
            "identical_to_plain": True,
            "token_seconds": times,
        }

    records = [
        row("plain", 0, [1.0, 2.0, 3.0, 4.0]),
        row("fast", 0, [3.0, 3.0001, 3.5, 4.0]),
        row("plain", 1, [1.0, 2.0, 3.0, 4.0]),
        row("fast", 1, [3.0, 3.0001, 3.5, 4.0]),
    ]
    fast = next(r for r in summarize(records) if r["method"] == "fast")
    assert fast["speedup"] == 1.0 and fast["decode_speedup"] == pytest.approx(2.0, abs=1e-3)
    assert fast["first_token_seconds"] == 3.0
    without_times = [{**r, "token_seconds": None} for r in records]
    assert (
        next(r for r in summarize(without_times) if r["method"] == "fast")["decode_speedup"] is None
    )


class Perturbed:
    """Wraps a method and changes the first new token of the first prompt it sees."""

    name = "perturbed"

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def run(self, prompt_ids, settings) -> MethodOutput:
        out = self.inner.run(prompt_ids, settings)
        self.calls += 1
        if self.calls == 2:  # the first recorded prompt (call 1 is the warm-up)
            out.token_ids = [(out.token_ids[0] + 1) % 32, *out.token_ids[1:]]
        return out


def test_identity_check_detects_a_changed_output(tiny_lm):
    perturbed = Perturbed(make_method("torch", "promptlookup", tiny_lm))
    result = run_bench(tiny_lm, rows(2), ["plain", perturbed], FAST)
    flags = [r["identical_to_plain"] for r in result.records if r["method"] == "perturbed"]
    assert flags == [False, True]
    row = next(r for r in result.summary if r["method"] == "perturbed")
    assert row["identical_fraction"] == 0.5


class Logged:
    """Wraps a method and notes, in a shared log, when it ran."""

    def __init__(self, inner, log: list) -> None:
        self.inner, self.log, self.name = inner, log, inner.name

    def run(self, prompt_ids, settings) -> MethodOutput:
        self.log.append(self.name)
        return self.inner.run(prompt_ids, settings)


def test_methods_run_in_a_balanced_order_prompt_by_prompt(tiny_lm):
    # A slow spell of a shared host, or what one method leaves behind for the next, should not
    # always meet the same neighbouring methods.
    log: list[str] = []
    names = ["plain", "hf-pld", "promptlookup"]
    methods = [Logged(make_method("torch", name, tiny_lm), log) for name in names]
    result = run_bench(tiny_lm, rows(4), methods, FAST, warmup=False)
    assert log == [names[i] for index in range(4) for i in method_order(3, index)]
    assert log[:6] == names + names[1:] + names[:1]
    # Rows keep the methods' own order, and identity is still checked against plain's output.
    assert [r["method"] for r in result.records] == names * 4
    assert all(r["identical_to_plain"] for r in result.records)


@pytest.mark.parametrize("count", range(1, 10))
def test_each_method_runs_after_every_other_equally_often_and_at_each_position(count):
    cycle = count if count % 2 == 0 else 2 * count
    orders = [method_order(count, index) for index in range(cycle)]
    assert all(sorted(order) == list(range(count)) for order in orders)
    after = collections.Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(after) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert len(set(after.values())) <= 1  # every ordered pair equally often
    positions = collections.Counter(
        (position, method) for order in orders for position, method in enumerate(order)
    )
    assert set(positions.values()) == {cycle // count}
    assert method_order(count, cycle + 1) == orders[1 % cycle]  # and then it repeats


class Scripted:
    """A method whose runs take the given seconds in turn (same tokens each time)."""

    def __init__(self, name: str, seconds: list[float], log: list) -> None:
        self.name, self.seconds, self.log = name, list(seconds), log

    def run(self, prompt_ids, settings) -> MethodOutput:
        self.log.append(self.name)
        return MethodOutput([5, 6, 7], self.seconds.pop(0), token_seconds=[0.1, 0.2, 0.3])


def test_repeat_keeps_each_methods_fastest_run_in_balanced_rounds(tiny_lm):
    log: list[str] = []
    methods = [
        Scripted("plain", [3.0, 1.0, 2.0, 2.0], log),
        Scripted("promptlookup", [0.5, 0.9, 0.4, 0.7], log),
    ]
    result = run_bench(tiny_lm, rows(2), methods, FAST, warmup=False, repeat=2)
    names = ["plain", "promptlookup"]
    assert log == [names[i] for step in range(4) for i in method_order(2, step)]
    by = {(r["id"], r["method"]): r for r in result.records}
    assert by[("p0", "plain")]["seconds"] == 1.0 and by[("p1", "plain")]["seconds"] == 2.0
    assert by[("p0", "promptlookup")]["repeat_seconds"] == [0.5, 0.9]
    assert by[("p0", "promptlookup")]["seconds"] == 0.5
    assert by[("p1", "promptlookup")]["seconds"] == 0.4
    with pytest.raises(InvalidParameterError, match="repeat"):
        run_bench(tiny_lm, rows(1), methods, FAST, warmup=False, repeat=0)


def test_report_states_the_spread_between_repeated_runs_of_the_same_work(tiny_lm):
    methods = [
        Scripted("plain", [3.0, 1.0, 2.0, 2.0], []),
        Scripted("promptlookup", [0.5, 0.9, 0.4, 0.7], []),
    ]
    result = run_bench(tiny_lm, rows(2), methods, FAST, warmup=False, repeat=2)
    # slowest / fastest per row: 3.0, 1.0, 1.8, 1.75 -> median 1.775, 90th percentile 2.64
    assert repeat_spread(result.records) == pytest.approx((1.775, 2.64), abs=0.006)
    report = render_markdown(result.summary, {"repeat": 2}, [], result.records)
    assert "took 1.7" in report and "2.64x at the 90th percentile" in report
    single = run_bench(tiny_lm, rows(1), ["plain"], FAST, warmup=False)
    assert repeat_spread(single.records) is None
    assert "Noise:" not in render_markdown(single.summary, {}, [], single.records)


def test_cli_repeat_keeps_every_runs_time_and_says_so_in_the_report(tiny_backend, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "--data",
        str(write_jsonl(tmp_path / "d.jsonl")),
        "-n",
        "6",
        "--methods",
        "promptlookup",
        "--repeat",
        "2",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    records = read_results(out / "results.jsonl")
    assert all(
        len(r["repeat_seconds"]) == 2 and r["seconds"] == min(r["repeat_seconds"]) for r in records
    )  # the same tokens each time, so the fastest is the shortest
    assert "each method's fastest of 2 runs per prompt" in (out / "report.md").read_text()


def test_sampling_rows_have_null_identity_and_per_prompt_seeds(tiny_lm):
    settings = Settings(max_new_tokens=10, temperature=1.0, seed=7)
    first = run_bench(tiny_lm, rows(2), ["plain", "promptlookup"], settings, warmup=False)
    second = run_bench(tiny_lm, rows(2), ["plain", "promptlookup"], settings, warmup=False)
    assert all(r["identical_to_plain"] is None for r in first.records)
    assert all(r["identical_fraction"] is None for r in first.summary)
    # The same seed per prompt and method reproduces every output.
    assert [r["text"] for r in first.records] == [r["text"] for r in second.records]


# -- counters ----------------------------------------------------------------------------------


def test_forward_trace_agrees_with_the_loops_own_counters(tiny_lm):
    prompt = tiny_lm.encode([{"role": "user", "content": TEXTS[0]}])
    # Whole drafts: an adaptive policy may probe the model outside the counted passes.
    fixed = (
        {"speculation": "fixed"}
        if "speculation" in inspect.signature(tiny_lm.generate).parameters
        else {}
    )
    # The trace sees calls of the model itself: run the loop's passes through the model's own
    # forward (a Llama's passes are otherwise written out, past its hooks).
    own_pass, tiny_lm.target.decoder_pass = tiny_lm.target.decoder_pass, None
    try:
        with ForwardTrace(tiny_lm.model) as trace:
            result = tiny_lm.generate(prompt, max_new_tokens=16, **fixed)
    finally:
        tiny_lm.target.decoder_pass = own_pass
    stats = result.stats
    assert stats.drafted_tokens > 0  # the check means something
    assert trace.counts(len(prompt), stats.new_tokens) == (
        stats.forward_passes,
        stats.drafted_tokens,
        stats.accepted_tokens,
    )


def test_plain_generate_counts_one_forward_pass_per_token(tiny_lm):
    prompt = tiny_lm.encode([{"role": "user", "content": TEXTS[1]}])
    out = make_method("torch", "plain", tiny_lm).run(prompt, FAST)
    assert out.forward_passes == len(out.token_ids) and out.drafted_tokens == 0
    pld = make_method("torch", "hf-pld:k=4", tiny_lm).run(prompt, FAST)
    assert pld.token_ids == out.token_ids
    assert pld.accepted_tokens == len(pld.token_ids) - pld.forward_passes
    assert 0 <= pld.accepted_tokens <= pld.drafted_tokens


# -- method specs ------------------------------------------------------------------------------


def test_method_specs_parse_with_parameters():
    assert split_methods("plain,promptlookup:k=4,min=2,hf-pld") == [
        "plain",
        "promptlookup:k=4,min=2",
        "hf-pld",
    ]
    assert parse_method_spec("promptlookup:k=4,min=2") == ("promptlookup", {"k": "4", "min": "2"})
    assert len(sweep_specs()) == 21 and "promptlookup:k=8,min=2" in sweep_specs()


def test_method_parameters_reach_the_drafter(tiny_lm):
    method = make_method("torch", "promptlookup:k=4,min=2,max=8", tiny_lm)
    assert method.name == "promptlookup:k=4,min=2,max=8"
    assert method.options == {"num_tokens": 4, "min_match": 2, "max_match": 8}
    with pytest.raises(InvalidParameterError, match="unknown parameter.*depth"):
        make_method("torch", "promptlookup:depth=3", tiny_lm)
    with pytest.raises(InvalidParameterError, match="num_tokens must be an integer, got .big."):
        make_method("torch", "promptlookup:k=big", tiny_lm)
    with pytest.raises(PromptLookupError):
        make_method("torch", "promptlookup:k=0", tiny_lm)


def test_sweep_decode_ratio_is_the_default_over_the_best_fixed_setting_by_decode():
    """The decode ratio compares with the fixed setting fastest *after the first pass*, which
    need not be the fastest overall (here k=8 decodes fastest, k=4 is fastest overall)."""
    summary = [
        {
            "task": "t",
            "method": method,
            "speedup": speedup,
            "decode_speedup": decode,
            "tokens_per_forward": 2.0,
        }
        for method, speedup, decode in (
            ("plain", 1.0, 1.0),
            ("promptlookup", 2.0, 3.0),
            ("promptlookup:k=4", 2.5, 2.0),
            ("promptlookup:k=8", 1.5, 4.0),
        )
    ]
    (best,) = best_promptlookup(summary)
    assert best["method"] == "promptlookup:k=4" and best["default_speedup"] == 2.0
    assert best["decode_ratio"] == 0.75


def test_sweep_reports_the_best_fixed_setting_and_the_default_against_it(tiny_lm, tmp_path):
    specs = ["promptlookup", "promptlookup:k=2,min=1", "promptlookup:k=4,min=1"]
    result = run_bench(
        tiny_lm, rows(1), specs, Settings(max_new_tokens=6), out_dir=tmp_path, warmup=False
    )
    best = best_promptlookup(result.summary)
    fastest_fixed = max(
        (r for r in result.summary if r["method"] in specs[1:]), key=lambda r: r["speedup"]
    )
    default = next(r for r in result.summary if r["method"] == "promptlookup")
    assert [b["method"] for b in best] == [fastest_fixed["method"]]
    assert best[0]["default_speedup"] == default["speedup"]
    report = (tmp_path / "report.md").read_text()
    assert "## Best promptlookup setting per task" in report
    assert f"{default['speedup'] / fastest_fixed['speedup']:.3f}" in report
    assert (tmp_path / "sweep.png").is_file()
    assert "default / best, held out" in report and "default / best, decode" in report
    # A tiny model's passes can come under the 1 ms that separates passes, so a row may have
    # no decode measure (None); the ratio then follows the rows that have one.
    decoded = [
        r["decode_speedup"]
        for r in result.summary
        if r["method"] in specs[1:] and r["decode_speedup"]
    ]
    if default["decode_speedup"] and decoded:
        assert best[0]["decode_ratio"] == pytest.approx(
            default["decode_speedup"] / max(decoded), abs=1e-4
        )
    else:
        assert best[0]["decode_ratio"] is None


def test_held_out_comparison_picks_each_half_s_setting_on_the_other_half():
    # Prompt times in seconds (10 tokens each) per method; tasks a and b, two prompts each.
    times = {
        "promptlookup": (1, 1, 1, 1),
        "promptlookup:k=4": (0.5, 2, 1, 1),
        "promptlookup:k=8": (2, 0.5, 1, 1),
        "plain": (3, 3, 3, 3),
    }
    rows = [
        {"task": task, "id": i, "method": method, "new_tokens": 10, "seconds": seconds[2 * t + i]}
        for method, seconds in times.items()
        for t, task in enumerate("ab")
        for i in range(2)
    ]
    # Task a: each half picks the setting that is slow on it: 20 tokens in 4 s vs 20 in 2 s.
    assert held_out_ratio(rows, "a") == 2.0
    assert held_out_ratio(rows, "b") == 1.0
    # All tasks at once: halves are (a0, b0) and (a1, b1); k=4 wins on (a0, b0) and is used on
    # (a1, b1): 2 + 1 s; k=8 wins on (a1, b1) and is used on (a0, b0): 2 + 1 s. 40 tokens in
    # 6 s, against the default's 40 in 4 s.
    assert held_out_ratio(rows, "all") == 1.5
    assert held_out_ratio(rows, "c") is None
    assert held_out_ratio([r for r in rows if r["method"] != "promptlookup"], "a") is None


# -- report-only and resume ------------------------------------------------------------------


def test_report_only_regenerates_from_results(tiny_backend, tmp_path):
    out = tmp_path / "out"
    assert (
        invoke(
            "--data",
            str(write_jsonl(tmp_path / "d.jsonl")),
            "-n",
            "6",
            "--methods",
            "promptlookup",
            "--out",
            str(out),
        ).exit_code
        == 0
    )
    summary = (out / "summary.json").read_text()
    for name in ("summary.json", "report.md", "speedup.png"):
        (out / name).unlink()
    result = invoke("--report-only", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").read_text() == summary
    assert (out / "report.md").is_file() and (out / "speedup.png").is_file()


def test_resume_keeps_complete_prompts_and_runs_the_rest(tiny_lm, tmp_path):
    first = run_bench(
        tiny_lm, rows(3), ["plain", "promptlookup"], FAST, out_dir=tmp_path, warmup=False
    )
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    # Interrupted: prompt 0 complete, prompt 1 half done, a cut-off line at the end.
    (tmp_path / "results.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    again = run_bench(
        tiny_lm,
        rows(3),
        ["plain", "promptlookup"],
        FAST,
        out_dir=tmp_path,
        warmup=False,
        resume=True,
    )
    assert again.records[:2] == first.records[:2]  # kept as measured
    assert [(r["id"], r["method"]) for r in again.records] == [
        (r["id"], r["method"]) for r in first.records
    ]
    assert read_results(tmp_path / "results.jsonl") == again.records


# -- bad input: one line, naming file and line -------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n{"id": "b", "messages": [}\n',
            ":2: not valid JSON",
        ),
        ('{"id": "a", "task": "t"}\n', ":1: row has no 'messages'"),
        ('{"id": "a", "messages": [{"role": "user"}]}\n', ":1: messages[0] needs string"),
        ("[1, 2]\n", ":1: expected a JSON object"),
        (
            '{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n' * 2,
            ":2: duplicate task/id",
        ),
    ],
)
def test_malformed_data_names_file_and_line(tiny_backend, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    result = invoke("--data", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert f"{path}{message}" in result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(PromptLookupError, match=message.split(": ")[0]):
        load_all([path])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "/nonexistent/x.jsonl"], "/nonexistent/x.jsonl: no such data file"),
        (["--methods", "plain,turbo"], "unknown method 'turbo'"),
        (["--methods", "promptlookup:depth=2"], "unknown parameter(s) depth"),
        (["--backend", "vllm"], "unknown backend 'vllm'"),
        (["--report-only"], "no such results file"),
    ],
)
def test_bad_arguments_fail_with_one_line(tiny_backend, tmp_path, args, message):
    data = write_jsonl(tmp_path / "d.jsonl")
    full = args if "--data" in args or "--report-only" in args else ["--data", str(data), *args]
    result = invoke(*full, "-n", "4", "--out", str(tmp_path / "out"))
    assert result.exit_code != 0
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_prompt_too_long_names_the_row(tiny_lm):
    long_row = BenchRow("t", "long", [{"role": "user", "content": "a" * 600}], source="f.jsonl:3")
    with pytest.raises(PromptLookupError, match="f.jsonl:3: prompt"):
        run_bench(tiny_lm, [long_row], ["plain"], FAST)


# -- the real default model --------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_on_the_default_model(default_lm, shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr(get_backend("torch"), "load", lambda *args: default_lm)
    out = tmp_path / "out"
    result = invoke(
        "--data",
        str(shared_data / "code_edit.jsonl"),
        "--limit",
        "1",
        "--max-new-tokens",
        "16",
        "--methods",
        "plain,hf-pld,promptlookup",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    records = read_results(out / "results.jsonl")
    assert len(records) == 3 and all(r["identical_to_plain"] for r in records)
    assert all(r["new_tokens"] == 16 or r["text"] for r in records)


def test_drafter_method_runs_a_drafter_spec_as_a_method(tiny_lm):
    from promptlookup.bench.race import register_drafter_method

    name = register_drafter_method("torch", "lookup-chain=prompt-lookup,none")
    result = run_bench(tiny_lm, rows(2), ["plain", name], FAST, warmup=False)
    mine = [r for r in result.records if r["method"] == name]
    assert len(mine) == 2 and all(r["identical_to_plain"] for r in mine)
