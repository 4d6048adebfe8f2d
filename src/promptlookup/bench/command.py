"""``promptlookup bench``: the command line over :func:`promptlookup.bench.run_bench`."""

from __future__ import annotations

import os
import shlex
import sys

import click

from ..cli import friendly_errors, model_options
from ..errors import InvalidParameterError
from ..machine import default_threads
from .suite import DEFAULT_PER_TASK


def register_drafter_method(backend: str, item: str) -> str:
    """``NAME=SPEC`` -> a method NAME of ``backend`` that runs promptlookup with drafter SPEC."""
    from ..drafters import check_drafter_spec
    from .methods import register_method

    name, sep, spec = item.partition("=")
    if not sep or not name or not spec or ":" in name or "," in name:
        raise click.UsageError(
            f"--drafter-method {item!r}: expected NAME=SPEC, e.g. "
            "chain=prompt-lookup,draft-model:default"
        )
    if backend != "transformers":
        raise click.UsageError("--drafter-method is available with --backend transformers")
    check_drafter_spec(spec)
    from .methods import PromptLookupMethod

    register_method(
        backend, name, lambda lm, options, spec=spec: PromptLookupMethod(lm, spec), params={}
    )
    return name


DEFAULT_TOKENS = 128
QUICK_TOKENS = 64
#: The methods a run compares unless --methods says otherwise.
DEFAULT_METHODS = "plain,hf-pld,promptlookup-none,promptlookup"
#: ... where prompts are constrained by a grammar (the structured task).
CONSTRAINED_METHODS = "plain,promptlookup-none,promptlookup"


@click.command()
@click.option(
    "--data",
    "data_files",
    multiple=True,
    metavar="FILE.jsonl",
    help="Prompts, one JSON object per line with id, task, messages (repeatable). Without "
    "it: the built-in suite, five tasks generated from this Python's standard library.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Use the first N rows of each file, or N prompts per task of the built-in suite "
    f"[all rows; {DEFAULT_PER_TASK} per task].",
)
@click.option(
    "--tasks",
    default=None,
    metavar="LIST",
    help="Built-in suite tasks to run, comma-separated, from code_edit, summarization, qa, "
    "chat, open_ended and structured (JSON schemas and tool calls: methods plain, "
    "promptlookup-none, promptlookup and servers) [the first five].",
)
@click.option(
    "--quick",
    is_flag=True,
    help=f"A first look: one prompt per task (--limit 1) and {QUICK_TOKENS} new tokens "
    "unless given.",
)
@click.option(
    "--max-new-tokens",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help=f"[{DEFAULT_TOKENS}; {QUICK_TOKENS} with --quick]",
)
@click.option(
    "--methods",
    default=None,
    help="Comma-separated methods; parameters as name:key=value,key=value, e.g. "
    "promptlookup:k=4,min=2. plain (the baseline) is always added; with promptlookup-none "
    "the report splits each promptlookup speed-up into the engine's part and drafting's. "
    f"[default: {DEFAULT_METHODS}; with the structured task, {CONSTRAINED_METHODS}]",
)
@click.option(
    "--drafter-method",
    "drafter_methods",
    multiple=True,
    metavar="NAME=SPEC",
    help="Add a method NAME running promptlookup with drafter SPEC (repeatable), e.g. "
    "'chain=prompt-lookup,draft-model:default' or 'ref=reference:old.py'.",
)
@click.option(
    "--against",
    "against",
    multiple=True,
    metavar="NAME=URL",
    help="Also race the OpenAI-compatible server at URL (llama-server, vLLM, promptlookup "
    "serve) as method NAME, interleaved with the others (repeatable), e.g. "
    "llamacpp=http://127.0.0.1:8080.",
)
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="The multi-turn session mode: N editing conversations (or, with --data, the first N "
    "rows, whose user messages are the turns), each turn the whole conversation so far with "
    "the method's own answers; time to first token per turn and "
    "end-to-end tokens/s of promptlookup in process (with a prefix cache; --methods none "
    "leaves it out) and the --against servers, each with its own defaults and prompt cache.",
)
@click.option(
    "--turns",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="With --sessions: turns per conversation.",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Also run promptlookup over k in {2,4,6,8,12,16,24} x min in {1,2,3} and "
    "report the best fixed setting per task.",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run every method N times per prompt and keep its fastest run (a slow "
    "spell of a shared machine must then hit all N to count).",
)
@click.option("--sampling", is_flag=True, help="Sample instead of greedy decoding.")
@click.option("--temperature", type=float, default=0.7, show_default=True, help="With --sampling.")
@click.option(
    "--top-k",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With --sampling; 0 = off.",
)
@click.option("--top-p", type=float, default=1.0, show_default=True, help="With --sampling.")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="With --sampling: prompt i uses seed + i, for every method.",
)
@model_options
@click.option(
    "--backend",
    default="transformers",
    show_default=True,
    help="transformers, or llama.cpp when its bench methods are installed.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch threads, fixed for the whole run [all cores].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Output folder: results.jsonl, summary.json, report.md, PNG figures.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the prompts already complete in OUT/results.jsonl; run the rest.",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Only regenerate summary.json, report.md and figures from OUT/results.jsonl.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@friendly_errors
def bench(
    data_files,
    limit,
    tasks,
    quick,
    max_new_tokens,
    methods,
    drafter_methods,
    against,
    sessions,
    turns,
    sweep,
    repeat,
    sampling,
    temperature,
    top_k,
    top_p,
    seed,
    model,
    dtype,
    device,
    backend,
    threads,
    out_dir,
    resume,
    report_only,
    no_progress,
):
    """Measure speed-ups against plain decoding, interleaving methods prompt by prompt.

    Every method runs on the same model object and the same tokenised prompts (the chat
    template applied to each row's messages); only generation is timed, after one warm-up
    generation per method. Greedy outputs are checked token by token against plain's.

    \b
    Methods (transformers backend):
      plain              model.generate, no assistance (the baseline)
      hf-pld             model.generate(prompt_lookup_num_tokens=10)   [k=, ngram=]
      promptlookup       promptlookup's loop, default drafter          [k=, min=, max=,
                                                                        speculation=]
      promptlookup-none  promptlookup's loop without a drafter (its overhead)
      promptlookup-fastest  promptlookup with the fastest kernels, exact or not (the price)
      hf-custom          model.generate(custom_generate=promptlookup)  [k=, min=, max=]

    \b
    Output in OUT: results.jsonl (one row per prompt x method, written as it goes),
    summary.json (per task x method), meta.json, report.md, speedup.png,
    tokens_per_forward.png (and sweep.png with --sweep). Where greedy outputs
    part from plain's (bfloat16), agreed_summary.json and the report also give
    each method's speed on the tokens that every method wrote first.

    \b
    Prompts: the files of --data, or else the built-in suite: code_edit,
    summarization, qa, chat and open_ended requests generated at run time from
    the installed Python standard library's sources and docstrings (the same
    prompts for the same Python version; meta.json names them by a fingerprint).

    \b
    Examples:
      promptlookup bench --quick --out first-look
      promptlookup bench --limit 12 --max-new-tokens 256 --out bench-out
      promptlookup bench --limit 4 --against llamacpp=http://127.0.0.1:8080 --out race
      promptlookup bench --tasks structured --methods promptlookup-none,promptlookup \
          --against llamacpp=http://127.0.0.1:8080 --max-new-tokens 256 --out structured
      promptlookup bench --data code_edit.jsonl --data chat.jsonl --limit 20 \\
          --max-new-tokens 256 --methods plain,hf-pld,promptlookup --out bench-out
    """
    from .methods import Settings, get_backend, split_methods, sweep_specs
    from .report import console_tables, report_from_dir
    from .summary import read_results

    if report_only:
        summary = report_from_dir(out_dir)
        records = read_results(
            os.path.join(out_dir, "results.jsonl"), tolerate_partial_last_line=True
        )
        click.echo(console_tables(records, summary))
        click.echo(f"report: {os.path.join(out_dir, 'report.md')}", err=True)
        return
    if sampling and temperature <= 0:
        raise click.UsageError("--sampling needs --temperature > 0")
    if not 0 < top_p <= 1:
        raise click.UsageError("--top-p must be in (0, 1]")
    from .methods import parse_method_spec
    from .servers import ServerMethod, parse_against

    if quick:
        limit = limit or 1
        max_new_tokens = max_new_tokens or QUICK_TOKENS
    max_new_tokens = max_new_tokens or DEFAULT_TOKENS
    if sessions:
        from .sessions.conversations import session_bench

        session_bench(
            sessions, turns, max_new_tokens, methods or "promptlookup", against, model, dtype,
            device, threads,
            out_dir, command="promptlookup " + shlex.join(sys.argv[1:]),
            rows=prompts(data_files, limit)[0] if data_files else (),
        )  # fmt: skip
        return
    rows, data = prompts(data_files, limit, tasks)
    # Grammar-constrained rows (the structured task): transformers' own prompt lookup
    # (hf-pld, hf-custom) verifies drafts past a logits processor, so it cannot keep to one.
    constrained = any(row.request for row in rows)
    methods = methods or (CONSTRAINED_METHODS if constrained else DEFAULT_METHODS)
    unconstrained = [m for m in split_names(methods) if m.split(":")[0] in ("hf-pld", "hf-custom")]
    if constrained and unconstrained:
        raise click.UsageError(
            f"--methods: {', '.join(unconstrained)} cannot keep to a grammar (transformers' "
            f"drafts bypass its logits processor); on the structured task use {CONSTRAINED_METHODS}"
            " and servers"
        )
    servers = [parse_against(item) for item in against]
    specs = split_methods(methods)
    if sweep:
        specs += [s for s in sweep_specs() if s not in specs]
    if not specs:
        raise click.UsageError("--methods is empty")
    registry = get_backend(backend).factories
    for item in drafter_methods:
        specs.append(register_drafter_method(backend, item))
    for spec in specs:  # unknown names fail before the (slow) model load
        name, _ = parse_method_spec(spec)
        if name not in registry:
            raise InvalidParameterError(
                f"unknown method {name!r} for backend {backend!r}; "
                f"choose {', '.join(sorted(registry))}"
            )
    settings = Settings(
        max_new_tokens=max_new_tokens,
        temperature=temperature if sampling else 0.0,
        top_k=top_k if sampling else 0,
        top_p=top_p if sampling else 1.0,
        seed=seed if sampling else None,
    )
    threads = threads or default_threads()
    import torch

    torch.set_num_threads(threads)
    loader = get_backend(backend).load
    # Servers answer (or fail with one line) before the slow model load.
    names = {parse_method_spec(spec)[0] for spec in specs}
    for name, _ in servers:
        if name in names or name == "plain":
            raise InvalidParameterError(f"--against {name}: a method of that name already runs")
        names.add(name)
    racing = [ServerMethod(name, url) for name, url in servers]
    lm = loader(model, dtype, device, threads)
    for server in racing:
        server.lm = lm  # its tokenizer re-encodes the servers' texts
    from .runner import run_bench

    result = run_bench(
        lm,
        rows,
        specs + racing,
        settings,
        backend=backend,
        out_dir=out_dir,
        progress=not no_progress,
        resume=resume,
        threads=threads,
        repeat=repeat,
        meta={
            "command": "promptlookup " + shlex.join(sys.argv[1:]),
            "model": getattr(lm, "name", model),
            "dtype": dtype,
            "device": device,
            "data": data,
            "against": {s.name: {"url": s.url, "model": s.model_id, "pid": s.pid} for s in racing},
        },
    )
    click.echo(console_tables(result.records, result.summary))
    click.echo(f"report: {os.path.join(out_dir, 'report.md')}", err=True)


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def prompts(data_files, limit: int | None, tasks: str | None = None):
    """The rows to run and how to name them in the report: the files', or the built-in
    suite's ``tasks`` (its Python version and fingerprint)."""
    import platform

    from .data import load_all
    from .suite import EXTRA_TASKS, TASKS, suite_fingerprint, suite_rows

    if data_files:
        if tasks:
            raise click.UsageError("--tasks chooses tasks of the built-in suite, not of --data")
        return load_all(data_files, limit), "files " + ", ".join(data_files)
    chosen = tuple(split_names(tasks)) if tasks else TASKS
    unknown = [task for task in chosen if task not in TASKS + EXTRA_TASKS]
    if unknown:
        raise click.UsageError(
            f"--tasks: unknown task {unknown[0]!r}; choose from {', '.join(TASKS + EXTRA_TASKS)}"
        )
    rows = suite_rows(limit, chosen)
    return rows, (
        f"the built-in suite ({len(rows)} prompts from the Python {platform.python_version()} "
        f"standard library; fingerprint {suite_fingerprint(rows)})"
    )
