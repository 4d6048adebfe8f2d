"""The built-in suite: five tasks from this Python's standard library, deterministic, of the
evaluation sets' shape; ``promptlookup bench`` runs it without --data, and --quick is short."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from promptlookup.bench import BenchRow, read_results
from promptlookup.bench import suite as suite_module
from promptlookup.bench.methods import get_backend
from promptlookup.bench.suite import (
    DEFAULT_PER_TASK,
    TASKS,
    stdlib_folder,
    suite_fingerprint,
    suite_rows,
)
from promptlookup.cli import main

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"```python\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def rows() -> list[BenchRow]:
    return suite_rows()


def test_every_task_has_its_prompts_in_order(rows):
    assert [r.task for r in rows] == [t for t in TASKS for _ in range(DEFAULT_PER_TASK)]
    assert len({(r.task, r.id) for r in rows}) == len(rows)


def test_prompts_have_the_evaluation_sets_shape(rows):
    for row in rows:
        roles = [m["role"] for m in row.messages]
        assert roles == (["user", "assistant", "user"] if row.task == "chat" else ["user"])
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in row.messages)
        if row.task in ("code_edit", "summarization", "qa", "chat"):
            code = CODE.search(row.messages[0]["content"]).group(1)
            ast.parse(code)  # whole definitions of real source, dedented
            assert "module" in row.source
    sizes = {
        t: [sum(len(m["content"]) for m in r.messages) for r in rows if r.task == t] for t in TASKS
    }
    # Characters (code runs ~3.5 per token): a few hundred to ~1,500 tokens of context.
    assert all(700 <= size <= 6000 for task in TASKS[:4] for size in sizes[task])
    assert max(sizes["summarization"]) > 3500 and min(sizes["code_edit"]) < 1500


def test_the_same_python_gives_the_same_prompts_and_limits_take_prefixes(rows):
    again = suite_rows()
    assert again == rows and suite_fingerprint(again) == suite_fingerprint(rows)
    two = suite_rows(limit=2)
    assert two == [r for r in rows if int(r.id.rsplit("-", 1)[1]) < 2]
    assert suite_fingerprint(two) != suite_fingerprint(rows)


def test_the_material_is_read_from_the_installed_standard_library():
    assert (stdlib_folder() / "textwrap.py").is_file()
    code_edit = suite_rows(limit=1, tasks=("code_edit",))[0]
    module = re.search(r"Python's `(\w+)` module", code_edit.messages[0]["content"]).group(1)
    source = (stdlib_folder() / f"{module}.py").read_text(encoding="utf-8")
    body = CODE.search(code_edit.messages[0]["content"]).group(1)
    assert body.splitlines()[1].strip() in source


def test_the_repository_holds_no_standard_library_text(rows):
    """The suite is generated at run time: no prompt's code is stored in the package."""
    package = (ROOT / "src" / "promptlookup").rglob("*.py")
    stored = "\n".join(path.read_text(encoding="utf-8") for path in package)
    for row in rows[::7]:
        code = CODE.search(row.messages[0]["content"])
        if code:
            longest = max(code.group(1).splitlines(), key=len)
            assert longest not in stored


# -- the command ----------------------------------------------------------------------------


def short_suite(calls: list):
    """The real suite cut to what the tiny model's context holds, noting the limit asked."""
    real = suite_module.suite_rows

    def rows(limit=None, tasks=TASKS):
        calls.append(limit)
        return [
            BenchRow(
                r.task,
                r.id,
                [{**m, "content": m["content"][:60]} for m in r.messages],
                source=r.source,
            )
            for r in real(limit, tasks)
        ]

    return rows


def test_bench_without_data_runs_the_suite_and_quick_is_short(tiny_lm, monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(suite_module, "suite_rows", short_suite(calls))
    monkeypatch.setattr(get_backend("torch"), "load", lambda *args: tiny_lm)
    out = tmp_path / "quick"
    result = CliRunner().invoke(
        main,
        ["bench", "--no-progress", "--quick", "--methods", "plain,promptlookup", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert calls == [1]
    records = read_results(out / "results.jsonl")
    assert [r["task"] for r in records if r["method"] == "plain"] == list(TASKS)
    assert all(r["new_tokens"] <= 64 for r in records)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["max_new_tokens"] == 64
    assert "built-in suite (5 prompts from the Python" in meta["data"]
    assert "fingerprint" in (out / "report.md").read_text()
    result = CliRunner().invoke(
        main,
        ["bench", "--no-progress", "--limit", "2", "-n", "4", "--methods", "plain"]
        + ["--out", str(tmp_path / "two")],
    )
    assert result.exit_code == 0, result.output
    assert calls[-1] == 2
    records = read_results(tmp_path / "two" / "results.jsonl")
    assert len(records) == 2 * len(TASKS) and max(r["new_tokens"] for r in records) <= 4
