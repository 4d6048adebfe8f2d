"""What a bench run writes (:mod:`.runner` runs it): one row of ``results.jsonl`` per
method and prompt (:class:`ResultRecord`: the method's fastest run, its output checked
against ``plain``'s and ``promptlookup-none``'s), the rows an earlier run completed (resume)
and ``meta.json`` (the machine, model, settings and methods)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from .memory import weights_format
from .methods import BASELINE, OWN_PLAIN, MethodOutput
from .structured import matches_schema


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
    #: Whether the answer matches its schema (the structured task; None for other tasks).
    valid: bool | None = None

    def as_dict(self) -> dict:
        record = asdict(self)
        for optional in ("repeat_seconds", "valid"):
            if record[optional] is None:
                del record[optional]
        return record


def _decode(model, token_ids: list[int]) -> str:
    if hasattr(model, "decode"):
        return model.decode(token_ids)
    return model.tokenizer.decode(token_ids, skip_special_tokens=True)


def _rounded(token_seconds: Sequence[float] | None) -> list[float] | None:
    return None if token_seconds is None else [round(t, 5) for t in token_seconds]


def _new_tokens(output: MethodOutput) -> int:
    return output.new_tokens if output.new_tokens is not None else len(output.token_ids)


def _fastest(outputs: Sequence[MethodOutput]) -> MethodOutput:
    """The run with the most new tokens per second (the first of equals), with the highest
    peak RSS of all the runs."""
    best = max(outputs, key=lambda out: _new_tokens(out) / max(out.seconds, 1e-9))
    peaks = [out.peak_rss_mib for out in outputs if out.peak_rss_mib is not None]
    return replace(best, peak_rss_mib=max(peaks) if peaks else None)


def same_output(model, one: MethodOutput, other: MethodOutput) -> bool:
    """Token for token; on text where either method reported text (a server)."""
    if one.text is None and other.text is None:
        return one.token_ids == other.token_ids
    texts = [o.text if o.text is not None else _decode(model, o.token_ids) for o in (one, other)]
    return texts[0] == texts[1]


def prompt_records(model, row, prompt_ids, runs: dict[str, list[MethodOutput]], sampling: bool):
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
            valid=matches_schema(text, row.request),
        )
        records.append(record.as_dict())
    return records


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


def completed_records(path: Path, method_names: list[str]) -> list[dict]:
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


def run_meta(model, given: dict, backend, settings, method_objs, repeat) -> dict:
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
