"""The report: per server and agent, from the proxy's records and the agent's run, the requests
and their statuses, model turns, tool calls the model made and those the agent executed (their
results came back), prompt and cached tokens and seconds per turn; as JSON and a markdown
table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .accounting import answered


def summarize(records: list[dict], run: dict) -> dict:
    """One agent's row: ``records`` are its proxy records in order, ``run`` what the harness
    saw (exit code, wall seconds, why it stopped, the task's outcome)."""
    turns = [r for r in records if r.get("api")]
    calls: dict[str, str] = {}  # call id -> tool name, every call the model made
    for record in turns:
        calls.update((record.get("answer") or {}).get("tool_calls") or {})
    results: set[str] = set()
    tool_errors = 0
    for record in turns:
        request = record.get("request") or {}
        results.update(request.get("tool_result_ids") or [])
        tool_errors = max(tool_errors, request.get("tool_errors") or 0)
    executed = [calls[i] for i in sorted(results) if i in calls]
    per_turn = []
    for record in turns:
        answer = record.get("answer") or {}
        prompt, cached = answer.get("prompt_tokens"), answer.get("cached_tokens")
        per_turn.append(
            {
                "status": record.get("status"),
                "api": record["api"],
                "seconds": record.get("seconds"),
                "first_byte_s": record.get("first_byte_s"),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "cached_share": round(cached / prompt, 3)
                if prompt and cached is not None
                else None,
                "completion_tokens": answer.get("completion_tokens"),
                "tool_calls": sorted((answer.get("tool_calls") or {}).values()),
                "keepalives": answer.get("keepalives", 0),
                "client_closed": record.get("client_closed", False),
                "answered": answered(record),
                "error": answer.get("error") or record.get("error"),
            }
        )
    statuses = Counter(str(r.get("status")) for r in records)
    failed = sum(1 for r in records if (r.get("status") or 0) >= 400)
    ok = [t for t in per_turn if t["answered"]]
    later = [t for t in ok[1:] if t["cached_share"] is not None]
    return {
        **run,
        "requests": len(records),
        "statuses": dict(sorted(statuses.items())),
        "failed_requests": failed,
        "turns": len(turns),
        "turns_ok": len(ok),
        "tool_calls_made": len(calls),
        "tool_calls_executed": len(executed),
        "tools_executed": dict(Counter(executed)),
        "tool_results_marked_error": tool_errors,
        "cached_share_later_turns": (
            round(min(t["cached_share"] for t in later), 3) if later else None
        ),
        "mean_seconds_per_turn": (
            round(sum(t["seconds"] for t in ok) / len(ok), 2) if ok else None
        ),
        "errors": sorted({t["error"] for t in per_turn if t["error"]}),
        "ignored": sorted(
            {f"{k}: {v}" for r in records for k, v in (r.get("ignored") or {}).items()}
        ),
        "per_turn": per_turn,
    }


def build(records: list[dict], runs: list[dict]) -> list[dict]:
    """Every run's row: ``runs`` carry ``server`` and ``agent``; a record's ``agent`` label is
    ``server/agent``."""
    rows = []
    for run in runs:
        label = f"{run['server']}/{run['agent']}"
        rows.append(summarize([r for r in records if r.get("agent") == label], run))
    return rows


def _cell_list(values, digits: int = 0) -> str:
    shown = ["-" if v is None else f"{v:.{digits}f}" for v in values]
    return " ".join(shown) if shown else "-"


def markdown(rows: list[dict], versions: dict[str, str]) -> str:
    """The report's table and, under it, each failing request's error line."""
    lines = [
        "| server | agent | exit | requests | statuses | turns ok/all | tool calls made / "
        "executed | cached tokens per turn | prompt tokens per turn | seconds per turn | "
        "tests pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        turns = row["per_turn"]
        statuses = ", ".join(f"{n} × {s}" for s, n in row["statuses"].items()) or "-"
        lines.append(
            f"| {row['server']} | {row['agent']} {versions.get(row['agent'], '')} "
            f"| {row.get('stopped', '')} {row.get('exit_code', '')} "
            f"| {row['requests']} | {statuses} | {row['turns_ok']}/{row['turns']} "
            f"| {row['tool_calls_made']} / {row['tool_calls_executed']} "
            f"| {_cell_list([t['cached_tokens'] for t in turns])} "
            f"| {_cell_list([t['prompt_tokens'] for t in turns])} "
            f"| {_cell_list([t['seconds'] for t in turns], 1)} "
            f"| {'yes' if row.get('tests_pass') else 'no'} |"
        )
    errors = [(row, error) for row in rows for error in row["errors"]]
    if errors:
        lines += ["", "Errors (the server's one line, or the proxy's):", ""]
        lines += [f"- {row['server']}/{row['agent']}: `{error}`" for row, error in errors]
    return "\n".join(lines) + "\n"


def write(folder: Path, rows: list[dict], versions: dict[str, str], meta: dict) -> Path:
    """``report.json`` and ``report.md`` in ``folder``; returns the markdown's path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {**meta, "versions": versions, "rows": rows}
    (folder / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    head = "# Agents against the servers\n\n" + "".join(f"- {k}: {v}\n" for k, v in meta.items())
    path = folder / "report.md"
    path.write_text(head + "\n" + markdown(rows, versions))
    return path


#: What the harness saw of each agent's run (the rest of a row comes from the records).
RUN_KEYS = ("server", "agent", "exit_code", "stopped", "wall_seconds", "tests_pass", "changed")


def rebuild(folder: Path) -> Path:
    """A run folder's report again, from its ``requests.jsonl`` and the runs and settings its
    ``report.json`` holds (after a change in how the records are read); the markdown's path."""
    data = json.loads((folder / "report.json").read_text())
    lines = (folder / "requests.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    runs = [{key: row[key] for key in RUN_KEYS if key in row} for row in data["rows"]]
    meta = {key: value for key, value in data.items() if key not in ("versions", "rows")}
    return write(folder, build(records, runs), data["versions"], meta)
