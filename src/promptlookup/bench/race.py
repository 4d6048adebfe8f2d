"""``promptlookup bench``'s prompt race: every method on every prompt of the files or the
built-in suite, interleaved (:func:`~promptlookup.bench.runner.run_bench`), with servers
raced beside them (``--against``). Everything the command line can get wrong is checked
before the (slow) model load.

The other modes have their own modules: the session mode (``--sessions``,
:func:`promptlookup.bench.sessions.conversations.session_bench`) and the report alone
(``--report-only``, :func:`promptlookup.bench.report.report_from_dir`).
"""

from __future__ import annotations

import click

from ..backend_names import backend_name
from ..errors import InvalidParameterError
from ..machine import default_threads
from .methods import Settings

#: The methods a race compares unless --methods says otherwise.
DEFAULT_METHODS = "plain,hf-pld,promptlookup-none,promptlookup"
#: ... where prompts are constrained by a grammar (the structured task).
CONSTRAINED_METHODS = "plain,promptlookup-none,promptlookup"
#: Methods whose drafts bypass a grammar's logits processor (transformers' own prompt lookup
#: verifies drafts past it), so they cannot run constrained rows.
UNCONSTRAINED_ONLY = ("hf-pld", "hf-custom")


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def prompt_rows(data_files, limit: int | None, tasks: str | None = None):
    """The rows to race and how the report names them: the files', or the built-in suite's
    ``tasks`` (its Python version and fingerprint)."""
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


def register_drafter_method(backend: str, item: str) -> str:
    """``NAME=SPEC`` -> a method NAME of ``backend`` that runs promptlookup with drafter SPEC."""
    from ..drafters import check_drafter_spec
    from .methods import PromptLookupMethod, register_method

    name, sep, spec = item.partition("=")
    if not sep or not name or not spec or ":" in name or "," in name:
        raise click.UsageError(
            f"--drafter-method {item!r}: expected NAME=SPEC, e.g. "
            "chain=prompt-lookup,draft-model:default"
        )
    if backend_name(backend) != "torch":
        raise click.UsageError("--drafter-method is available with --backend torch")
    check_drafter_spec(spec)
    register_method(
        backend, name, lambda lm, options, spec=spec: PromptLookupMethod(lm, spec), params={}
    )
    return name


def method_specs(
    methods: str | None, constrained: bool, sweep: bool, backend: str, drafter_methods=()
) -> list[str]:
    """The specs of the methods to race (``--methods``, the sweep's, ``--drafter-method``'s),
    each checked to name a method of ``backend`` and to keep to a grammar where rows are
    ``constrained``."""
    from .methods import get_backend, parse_method_spec, split_methods, sweep_specs

    specs = split_methods(methods or (CONSTRAINED_METHODS if constrained else DEFAULT_METHODS))
    unconstrained = [s for s in specs if parse_method_spec(s)[0] in UNCONSTRAINED_ONLY]
    if constrained and unconstrained:
        raise click.UsageError(
            f"--methods: {', '.join(unconstrained)} cannot keep to a grammar (transformers' "
            f"drafts bypass its logits processor); on the structured task use {CONSTRAINED_METHODS}"
            " and servers"
        )
    if sweep:
        specs += [s for s in sweep_specs() if s not in specs]
    if not specs:
        raise click.UsageError("--methods is empty")
    registry = get_backend(backend).factories
    specs += [register_drafter_method(backend, item) for item in drafter_methods]
    for spec in specs:
        name, _ = parse_method_spec(spec)
        if name not in registry:
            raise InvalidParameterError(
                f"unknown method {name!r} for backend {backend!r}; "
                f"choose {', '.join(sorted(registry))}"
            )
    return specs


def server_methods(against, specs: list[str]) -> list:
    """The servers of ``--against`` as methods, their names unused by ``specs``; each answers
    (or fails with one line) here."""
    from .methods import BASELINE, parse_method_spec
    from .servers import ServerMethod, parse_against

    servers = [parse_against(item) for item in against]
    names = {parse_method_spec(spec)[0] for spec in specs}
    for name, _ in servers:
        if name in names or name == BASELINE:
            raise InvalidParameterError(f"--against {name}: a method of that name already runs")
        names.add(name)
    return [ServerMethod(name, url) for name, url in servers]


def race(
    *,
    rows,
    data: str,
    methods: str | None,
    settings: Settings,
    model,
    dtype: str,
    device: str,
    backend: str,
    out_dir: str,
    command: str,
    drafter_methods=(),
    against=(),
    sweep: bool = False,
    repeat: int = 1,
    threads: int | None = None,
    resume: bool = False,
    progress: bool = True,
):
    """Race the methods and servers on ``rows`` (described as ``data`` in the report) with
    the model loaded once; writes OUT and returns the
    :class:`~promptlookup.bench.runner.BenchResult`."""
    from .methods import get_backend
    from .runner import run_bench

    # Every check before the slow model load.
    backend = backend_name(backend)  # its current name in meta.json
    constrained = any(row.request for row in rows)
    specs = method_specs(methods, constrained, sweep, backend, drafter_methods)
    racing = server_methods(against, specs)
    threads = threads or default_threads()
    import torch

    torch.set_num_threads(threads)
    lm = get_backend(backend).load(model, dtype, device, threads)
    for server in racing:
        server.lm = lm  # its tokenizer re-encodes the servers' texts
    return run_bench(
        lm,
        rows,
        specs + racing,
        settings,
        backend=backend,
        out_dir=out_dir,
        progress=progress,
        resume=resume,
        threads=threads,
        repeat=repeat,
        meta={
            "command": command,
            "model": getattr(lm, "name", model),
            "dtype": dtype,
            "device": device,
            "data": data,
            "against": {s.name: {"url": s.url, "model": s.model_id, "pid": s.pid} for s in racing},
        },
    )
