"""Running a benchmark: every method on every prompt, interleaved, one JSON row per generation.

Fairness policies:

- One model object and one tokenised prompt per row, shared by every method; tokenisation and
  detokenisation are outside the timed region (each method times its generation call alone).
- A warm-up first: each method once on the first prompt (at most 32 new tokens), not recorded.
- Interleaved prompt by prompt, in a balanced order (:func:`method_order`): every method runs
  first equally often and is run right after each other method equally often, so slow drifts
  of a noisy machine hit every method alike, a slow spell is not always met by the same
  neighbours (on a shared host every pass can run ~1.7x slower for 10-20 s), and whatever one
  method leaves behind for the next (memory to fault in again, caches) is not always paid by the
  same method. ``plain`` (the baseline of the identity check) is added when not asked for; rows
  are written in the methods' own order once a prompt is done.
- ``repeat=N`` runs every method N times per prompt (each round in the next balanced order)
  and keeps its fastest run (most tokens/s; ``repeat_seconds`` lists all N): a slow spell
  must then meet all N runs of a method to count, which matters when the best of many
  settings is taken (``--sweep``).
- Greedy runs compare each method's new tokens (up to and including EOS) with ``plain``'s:
  ``identical_to_plain`` true/false; null when sampling, where outputs legitimately differ.
- When ``promptlookup-none`` runs too, ``identical_to_none`` says whether each output equals
  its (greedy or seeded sampling alike: the same seed must give the same text); else null.
  Sampling seeds each prompt with ``seed + prompt index``, the same for every method.

Each row also keeps the new token ids and ``token_seconds``, the time from the call's start at
which each arrived, from which the report times every method on the tokens all of them wrote
(:mod:`promptlookup.bench.agreed`), and ``peak_rss_mib``, the peak resident memory of the
process that generated, during its generations (:mod:`promptlookup.bench.memory`). Methods with
a ``run_chat(messages, settings)`` (servers, :mod:`promptlookup.bench.servers`) get the row's
messages instead of its token ids, and their identity is checked on text.

``results.jsonl`` is written and flushed prompt by prompt, so an interrupted run keeps what it
measured; ``resume=True`` keeps the prompts already complete in it and runs the rest. The rows
and ``meta.json`` are made in :mod:`promptlookup.bench.records`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..backend_names import DEFAULT_BACKEND
from ..errors import InvalidParameterError, PromptLookupError, PromptTooLongError
from .data import BenchRow
from .memory import PeakMeter
from .methods import BASELINE, Method, MethodOutput, Settings, make_method
from .records import completed_records, prompt_records, run_meta
from .structured import constraint

WARMUP_TOKENS = 32


@dataclass
class BenchResult:
    records: list[dict]  # rows of results.jsonl
    summary: list[dict]  # rows of summary.json
    out_dir: Path | None = None


def resolve_methods(model, methods: Sequence, backend: str = DEFAULT_BACKEND) -> list[Method]:
    """Method objects for specs (strings) or ready methods, ``plain`` first, names unique."""
    resolved = [make_method(backend, m, model) if isinstance(m, str) else m for m in methods]
    names = [m.name for m in resolved]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidParameterError(f"method(s) listed twice: {', '.join(duplicates)}")
    baseline = [m for m in resolved if m.name == BASELINE]
    if not baseline:
        baseline = [make_method(backend, BASELINE, model)]
    return baseline + [m for m in resolved if m.name != BASELINE]


def _max_context(model) -> int | None:
    context = getattr(model, "max_context", None)
    return context or getattr(getattr(model, "target", None), "max_context", None)


def encode_rows(model, rows: Sequence[BenchRow], max_new_tokens: int) -> list[list[int]]:
    """Token ids of every row's chat (untimed), checking each fits the model's context."""
    context = _max_context(model)
    encoded = []
    for row in rows:
        try:
            ids = list(model.encode(constraint(row.messages, row.request)[0]))
        except PromptLookupError as exc:
            raise type(exc)(f"{row.source}: {exc}") from None
        if context and len(ids) + max_new_tokens > context:
            raise PromptTooLongError(
                f"{row.source}: prompt ({len(ids)} tokens) + max_new_tokens "
                f"({max_new_tokens}) exceeds the context of {context}"
            )
        encoded.append(ids)
    return encoded


def generate(method, prompt_ids: Sequence[int], row: BenchRow, settings: Settings):
    """One timed generation of ``method`` on a row, with its process's peak RSS."""
    meter = PeakMeter(getattr(method, "pid", None))
    meter.start()
    if hasattr(method, "run_chat"):
        output = method.run_chat(row.messages, settings)
    else:
        output = method.run(prompt_ids, settings)
    output.peak_rss_mib = meter.stop()
    return output


def method_order(count: int, index: int) -> list[int]:
    """The order in which ``count`` methods run on prompt ``index``: a Williams design (a Latin
    square balanced for the method run just before). Policy: over each ``count`` prompts
    (``2 * count`` for an odd count), every method runs at each position equally often and
    right after each other method equally often (once, twice for an odd count). A plain
    rotation (A B C D, B C D A, ...) would have B always right after A.

    >>> [method_order(4, index) for index in range(4)]
    [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    >>> [method_order(3, index) for index in range(6)]
    [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [0, 2, 1], [1, 0, 2]]
    """
    # 0, 1, n-1, 2, n-2, ...: consecutive differences n-1 distinct values mod n.
    base = [(step + 1) // 2 if step % 2 else (count - step // 2) % count for step in range(count)]
    shift = index % count
    order = [(method + shift) % count for method in base]
    return order[::-1] if count % 2 and index // count % 2 else order


def run_bench(
    model,
    rows: Sequence[BenchRow],
    methods: Sequence,
    settings: Settings = Settings(),
    *,
    backend: str = DEFAULT_BACKEND,
    out_dir: str | Path | None = None,
    warmup: bool = True,
    progress: bool = False,
    resume: bool = False,
    threads: int | None = None,
    meta: dict | None = None,
    repeat: int = 1,
) -> BenchResult:
    """Benchmark ``methods`` (specs like ``"promptlookup:k=4"`` or method objects) on ``rows``
    with an already loaded ``model`` (a :class:`~promptlookup.LanguageModel` for the
    torch backend). With ``out_dir``, writes results.jsonl, summary.json, report.md,
    meta.json and figures there. ``repeat``: runs per method and prompt, the fastest kept.
    Returns the records and the summary."""
    from .report import write_outputs
    from .summary import summarize

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if not isinstance(repeat, int) or repeat < 1:
        raise InvalidParameterError(f"repeat must be an integer >= 1, got {repeat!r}")
    if settings.sampling and settings.seed is None:
        settings = replace(settings, seed=0)
    method_objs = resolve_methods(model, methods, backend)
    prompts = encode_rows(model, rows, settings.max_new_tokens)
    meta = run_meta(model, meta or {}, backend, settings, method_objs, repeat)
    out = Path(out_dir) if out_dir is not None else None
    records: list[dict] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if resume:
            records = completed_records(out / "results.jsonl", [m.name for m in method_objs])
    done = {(r["task"], r["id"]) for r in records}
    handle = (out / "results.jsonl").open("w", encoding="utf-8") if out is not None else None
    try:
        for record in records:  # kept from an earlier run (resume)
            handle.write(json.dumps(record) + "\n")
        if warmup and prompts:  # every method once, not recorded
            tokens = min(settings.max_new_tokens, WARMUP_TOKENS)  # a grammar's set-up, too
            warm = replace(settings, max_new_tokens=tokens, request=rows[0].request)
            for method in method_objs:
                generate(method, prompts[0], rows[0], warm)
        todo = [
            (i, row, ids)
            for i, (row, ids) in enumerate(zip(rows, prompts))
            if (row.task, row.id) not in done
        ]
        with _progress_bar(len(todo) * len(method_objs) * repeat, progress) as bar:
            for index, row, prompt_ids in todo:
                # Every method on this prompt (interleaved), then its rows, written at once.
                if settings.sampling:
                    prompt_settings = replace(settings, seed=settings.seed + index)
                else:
                    prompt_settings = settings
                prompt_settings = replace(prompt_settings, request=row.request)
                runs = _run_prompt(
                    method_objs, index, row, prompt_ids, prompt_settings, repeat, bar
                )
                for record in prompt_records(model, row, prompt_ids, runs, settings.sampling):
                    records.append(record)
                    if handle is not None:
                        handle.write(json.dumps(record) + "\n")
                        handle.flush()
    finally:
        if handle is not None:
            handle.close()
    summary = summarize(records)
    if out is not None:
        write_outputs(out, records, meta)
    return BenchResult(records, summary, out)


def _progress_bar(total: int, shown: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        disable=not shown,
        unit="gen",
        desc="bench",
        file=sys.stderr,
        dynamic_ncols=True,
    )


def _run_prompt(method_objs, index, row, prompt_ids, settings, repeat, bar):
    """Every method's ``repeat`` runs on prompt ``index``, each round in its balanced order
    (:func:`method_order`): ``{method name: its outputs}``, in the methods' order."""
    runs: dict[str, list[MethodOutput]] = {m.name: [] for m in method_objs}
    for round_ in range(repeat):
        for i in method_order(len(method_objs), index * repeat + round_):
            method = method_objs[i]
            bar.set_postfix_str(f"{row.task}/{row.id} {method.name}", refresh=False)
            runs[method.name].append(generate(method, prompt_ids, row, settings))
            bar.update(1)
    return runs
