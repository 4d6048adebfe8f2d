"""Benchmarks: speed of promptlookup against plain decoding and transformers' prompt lookup.

>>> from promptlookup.bench import run_bench, suite_rows, Settings        # doctest: +SKIP
>>> result = run_bench(lm, suite_rows(limit=2),            # or load_all(["code_edit.jsonl"])
...                    ["plain", "hf-pld", "promptlookup"], Settings(max_new_tokens=128),
...                    out_dir="bench-out")                                  # doctest: +SKIP
>>> result.summary                                                           # doctest: +SKIP

Layout: :mod:`.data` reads prompt files, :mod:`.suite` generates the built-in suite,
:mod:`.methods` is the method registry (and how a backend adds methods),
:mod:`.torch_methods` the torch backend's methods, :mod:`.servers` races
OpenAI-compatible servers, :mod:`.runner` runs and records (:mod:`.memory`: peak RSS),
:mod:`.report` summarizes and draws, :mod:`.command` is the CLI, which runs the prompt race
(:mod:`.race`) or the session mode (:mod:`.sessions`).
Importing this package loads no model.
"""

from __future__ import annotations

from .data import BenchDataError, BenchRow, load_all, load_rows
from .methods import (
    MethodOutput,
    Settings,
    make_method,
    parse_method_spec,
    register_backend,
    register_method,
)
from .report import report_from_dir
from .runner import BenchResult, run_bench
from .suite import suite_rows
from .summary import read_results, summarize

__all__ = [
    "BenchDataError",
    "BenchResult",
    "BenchRow",
    "MethodOutput",
    "Settings",
    "load_all",
    "load_rows",
    "make_method",
    "parse_method_spec",
    "read_results",
    "register_backend",
    "register_method",
    "report_from_dir",
    "run_bench",
    "suite_rows",
    "summarize",
]
