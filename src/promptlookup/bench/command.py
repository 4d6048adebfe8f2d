"""``promptlookup bench``: its options and help, and which mode runs: the prompt race
(:mod:`.race`), the session mode (``--sessions``, :mod:`.sessions.conversations`) or the
report alone (``--report-only``, :mod:`.report`)."""

from __future__ import annotations

import functools
import os
import shlex
import sys

import click

from ..backend_names import DEFAULT_BACKEND
from ..cli import friendly_errors, model_options
from .race import CONSTRAINED_METHODS, DEFAULT_METHODS, prompt_rows, race
from .suite import DEFAULT_PER_TASK

#: New tokens per generation unless --max-new-tokens says otherwise (and with --quick).
DEFAULT_TOKENS = 128
QUICK_TOKENS = 64


def sampling_options(func):
    """--sampling, --temperature, --top-k, --top-p and --seed, checked, as one dict for the
    command: ``sampling``, the sampling fields of :class:`~promptlookup.bench.methods.Settings`
    (greedy's without --sampling)."""

    @functools.wraps(func)
    def command(*args, sampling, temperature, top_k, top_p, seed, **values):
        if sampling and temperature <= 0:
            raise click.UsageError("--sampling needs --temperature > 0")
        if not 0 < top_p <= 1:
            raise click.UsageError("--top-p must be in (0, 1]")
        if not sampling:
            temperature, top_k, top_p, seed = 0.0, 0, 1.0, None
        chosen = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        return func(*args, sampling=chosen, **values)

    options = [
        click.option("--sampling", is_flag=True, help="Sample instead of greedy decoding."),
        click.option(
            "--temperature", type=float, default=0.7, show_default=True, help="With --sampling."
        ),
        click.option(
            "--top-k",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="With --sampling; 0 = off.",
        ),
        click.option(
            "--top-p", type=float, default=1.0, show_default=True, help="With --sampling."
        ),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="With --sampling: prompt i uses seed + i, for every method.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


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
    "--session-chars",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --sessions (built-in sessions): each session's file about N characters of "
    "Python, its module's functions then the next modules' (18000: about 5,000 tokens of "
    "repository context, as a coding agent sends) [one module, up to 6000].",
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
@sampling_options
@model_options
@click.option(
    "--backend",
    default=DEFAULT_BACKEND,
    show_default=True,
    help="torch ('transformers', its name before 0.15, is taken too), or llama.cpp when its "
    "bench methods are installed.",
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
    session_chars,
    sweep,
    repeat,
    sampling,
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
    Methods (torch backend):
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
      promptlookup bench --tasks structured --methods promptlookup-none,promptlookup \\
          --against llamacpp=http://127.0.0.1:8080 --max-new-tokens 256 --out structured
      promptlookup bench --data code_edit.jsonl --data chat.jsonl --limit 20 \\
          --max-new-tokens 256 --methods plain,hf-pld,promptlookup --out bench-out
    """
    command = "promptlookup " + shlex.join(sys.argv[1:])
    if report_only:
        from .report import report_from_dir
        from .summary import read_results

        summary = report_from_dir(out_dir)
        path = os.path.join(out_dir, "results.jsonl")
        show(read_results(path, tolerate_partial_last_line=True), summary, out_dir)
        return
    if quick:
        limit = limit or 1
        max_new_tokens = max_new_tokens or QUICK_TOKENS
    max_new_tokens = max_new_tokens or DEFAULT_TOKENS
    if sessions:
        from .data import load_all
        from .sessions.conversations import session_bench

        session_bench(
            sessions=sessions,
            turns=turns,
            max_tokens=max_new_tokens,
            methods=methods or "promptlookup",
            against=against,
            model=model,
            dtype=dtype,
            device=device,
            threads=threads,
            out_dir=out_dir,
            command=command,
            rows=load_all(data_files, limit) if data_files else (),
            file_chars=session_chars,
        )
        return
    from .methods import Settings

    rows, data = prompt_rows(data_files, limit, tasks)
    result = race(
        rows=rows,
        data=data,
        methods=methods,
        settings=Settings(max_new_tokens=max_new_tokens, **sampling),
        model=model,
        dtype=dtype,
        device=device,
        backend=backend,
        out_dir=out_dir,
        command=command,
        drafter_methods=drafter_methods,
        against=against,
        sweep=sweep,
        repeat=repeat,
        threads=threads,
        resume=resume,
        progress=not no_progress,
    )
    show(result.records, result.summary, out_dir)


def show(records, summary, out_dir: str) -> None:
    """The summary's tables on stdout, where the report is on stderr."""
    from .report import console_tables

    click.echo(console_tables(records, summary))
    click.echo(f"report: {os.path.join(out_dir, 'report.md')}", err=True)
