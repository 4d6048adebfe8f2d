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
measured; ``resume=True`` keeps the prompts already complete in it and runs the rest.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ..errors import InvalidParameterError, PromptLookupError, PromptTooLongError
from .data import BenchRow
from .memory import PeakMeter, weights_format
from .methods import BASELINE, OWN_PLAIN, Method, MethodOutput, Settings, make_method


@dataclass
class ResultRecord:
    """One row of ``results.jsonl``: one method's generation on one prompt (its fastest of
    ``repeat`` runs, whose seconds ``repeat_seconds`` lists when there were several)."""

    task: str
    id: str
    method: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    forward_passes: int | None
    drafted_tokens: int | None
    accepted_tokens: int | None
    identical_to_plain: bool | None
    identical_to_none: bool | None
    text: str
    token_ids: list[int]
    token_seconds: list[float] | None
    peak_rss_mib: float | None
    repeat_seconds: list[float] | None = None

    def as_dict(self) -> dict:
        record = asdict(self)
        if record["repeat_seconds"] is None:
            del record["repeat_seconds"]
        return record


WARMUP_TOKENS = 32


@dataclass
class BenchResult:
    records: list[dict]  # rows of results.jsonl
    summary: list[dict]  # rows of summary.json
    out_dir: Path | None = None


def resolve_methods(model, methods: Sequence, backend: str = "transformers") -> list[Method]:
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


def _decode(model, token_ids: list[int]) -> str:
    if hasattr(model, "decode"):
        return model.decode(token_ids)
    return model.tokenizer.decode(token_ids, skip_special_tokens=True)


def _rounded(token_seconds: Sequence[float] | None) -> list[float] | None:
    return None if token_seconds is None else [round(t, 5) for t in token_seconds]


def _max_context(model) -> int | None:
    context = getattr(model, "max_context", None)
    return context or getattr(getattr(model, "target", None), "max_context", None)


def encode_rows(model, rows: Sequence[BenchRow], max_new_tokens: int) -> list[list[int]]:
    """Token ids of every row's chat (untimed), checking each fits the model's context."""
    context = _max_context(model)
    encoded = []
    for row in rows:
        try:
            ids = list(model.encode(row.messages))
        except PromptLookupError as exc:
            raise type(exc)(f"{row.source}: {exc}") from None
        if context and len(ids) + max_new_tokens > context:
            raise PromptTooLongError(
                f"{row.source}: prompt ({len(ids)} tokens) + max_new_tokens "
                f"({max_new_tokens}) exceeds the context of {context}"
            )
        encoded.append(ids)
    return encoded


def machine_info() -> dict:
    """CPU model, cores, torch's thread count and the load average (other work competing for
    the CPU when the run started), for the report."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:  # pragma: no cover
        transformers_version = None
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    from .. import __version__

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": load,
        "promptlookup": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "platform": platform.platform(),
    }


def _completed(path: Path, method_names: list[str]) -> list[dict]:
    """Rows of prompts that every method finished in an earlier run (for resume)."""
    if not path.is_file():
        return []
    from .summary import read_results

    by_prompt: dict[tuple, list[dict]] = {}
    for record in read_results(path, tolerate_partial_last_line=True):
        by_prompt.setdefault((record["task"], record["id"]), []).append(record)
    kept = []
    for records in by_prompt.values():
        if sorted(r["method"] for r in records) == sorted(method_names):
            kept.extend(records)
    return kept


def _new_tokens(output: MethodOutput) -> int:
    return output.new_tokens if output.new_tokens is not None else len(output.token_ids)


def _fastest(outputs: Sequence[MethodOutput]) -> MethodOutput:
    """The run with the most new tokens per second (the first of equals), with the highest
    peak RSS of all the runs."""
    best = max(outputs, key=lambda out: _new_tokens(out) / max(out.seconds, 1e-9))
    peaks = [out.peak_rss_mib for out in outputs if out.peak_rss_mib is not None]
    return replace(best, peak_rss_mib=max(peaks) if peaks else None)


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


def same_output(model, one: MethodOutput, other: MethodOutput) -> bool:
    """Token for token; on text where either method reported text (a server)."""
    if one.text is None and other.text is None:
        return one.token_ids == other.token_ids
    texts = [o.text if o.text is not None else _decode(model, o.token_ids) for o in (one, other)]
    return texts[0] == texts[1]


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
    backend: str = "transformers",
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
    transformers backend). With ``out_dir``, writes results.jsonl, summary.json, report.md,
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
    meta = _meta(model, meta or {}, backend, settings, method_objs, repeat)
    out = Path(out_dir) if out_dir is not None else None
    records: list[dict] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if resume:
            records = _completed(out / "results.jsonl", [m.name for m in method_objs])
    done = {(r["task"], r["id"]) for r in records}
    handle = (out / "results.jsonl").open("w", encoding="utf-8") if out is not None else None
    try:
        for record in records:  # kept from an earlier run (resume)
            handle.write(json.dumps(record) + "\n")
        if warmup and prompts:  # every method once, not recorded
            warm = replace(settings, max_new_tokens=min(settings.max_new_tokens, WARMUP_TOKENS))
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
                runs = _run_prompt(
                    method_objs, index, row, prompt_ids, prompt_settings, repeat, bar
                )
                for record in _records(model, row, prompt_ids, runs, settings.sampling):
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


def _meta(model, given: dict, backend, settings, method_objs, repeat) -> dict:
    """meta.json: ``given`` (the command's), the machine, model, settings and methods."""
    return {
        **given,
        "machine": machine_info(),
        "backend": backend,
        "model": given.get("model") or getattr(model, "name", None),
        "weights": weights_format(model),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": settings.__dict__,
        "methods": [m.name for m in method_objs],
        "repeat": repeat,
        "command": given.get("command") or " ".join(sys.argv),
    }


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


def _records(model, row, prompt_ids, runs: dict[str, list[MethodOutput]], sampling: bool):
    """The rows of one prompt: each method's fastest run, checked against ``plain``'s output
    (greedy) and ``promptlookup-none``'s (when it ran)."""
    outputs = {name: _fastest(outs) for name, outs in runs.items()}
    baseline, own_plain = outputs[BASELINE], outputs.get(OWN_PLAIN)
    records = []
    for name, output in outputs.items():
        text = output.text if output.text is not None else _decode(model, output.token_ids)
        record = ResultRecord(
            task=row.task,
            id=row.id,
            method=name,
            prompt_tokens=len(prompt_ids),
            new_tokens=_new_tokens(output),
            seconds=round(output.seconds, 6),
            forward_passes=output.forward_passes,
            drafted_tokens=output.drafted_tokens,
            accepted_tokens=output.accepted_tokens,
            identical_to_plain=None if sampling else same_output(model, output, baseline),
            identical_to_none=None if own_plain is None else same_output(model, output, own_plain),
            text=text,
            token_ids=list(output.token_ids),
            token_seconds=_rounded(output.token_seconds),
            peak_rss_mib=output.peak_rss_mib,
            repeat_seconds=[round(o.seconds, 6) for o in runs[name]]
            if len(runs[name]) > 1
            else None,
        )
        records.append(record.as_dict())
    return records
