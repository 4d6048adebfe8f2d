"""Benchmark prompts: JSONL files with one chat request per line.

Each line is an object ``{"id", "task", "messages": [{"role", "content"}, ...], "reference"?}``
(the schema of ``shared/data/*.jsonl``). ``task`` defaults to the file's stem and ``id`` to the
line number; ``messages`` is required. Blank lines are skipped. Any other problem stops the
benchmark before a model is loaded, with one line naming the file and line.

Hugging Face ``datasets`` sources are not supported: convert them to this JSONL first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PromptLookupError


class BenchDataError(PromptLookupError):
    """A benchmark data file is missing or malformed (the message names file and line)."""


@dataclass(frozen=True)
class BenchRow:
    """One benchmark prompt. ``source`` is ``"FILE:LINE"`` for error messages."""

    task: str
    id: str
    messages: list = field(hash=False)
    reference: str | None = None
    source: str = ""
    #: OpenAI request fields the answer must honour (``response_format``, or ``tools`` and
    #: ``tool_choice``; the suite's structured task, :mod:`.structured`).
    request: dict | None = field(default=None, hash=False, compare=False)


def _check_messages(messages, where: str) -> list:
    if not isinstance(messages, list) or not messages:
        raise BenchDataError(
            f'{where}: \'messages\' must be a non-empty list of {{"role", "content"}} objects'
        )
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise BenchDataError(f"{where}: messages[{i}] needs string 'role' and 'content'")
    return messages


def parse_line(text: str, path: str, line_number: int) -> BenchRow:
    where = f"{path}:{line_number}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchDataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise BenchDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" not in obj:
        raise BenchDataError(f"{where}: row has no 'messages'")
    messages = _check_messages(obj["messages"], where)
    reference = obj.get("reference")
    return BenchRow(
        task=str(obj.get("task") or Path(path).stem),
        id=str(obj.get("id", line_number)),
        messages=messages,
        reference=reference if isinstance(reference, str) else None,
        source=where,
    )


def load_rows(path: str | Path, limit: int | None = None) -> list[BenchRow]:
    """The first ``limit`` rows (all when None) of one JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise BenchDataError(f"{path}: no such data file")
    rows: list[BenchRow] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for line_number, text in enumerate(handle, start=1):
                if limit is not None and len(rows) >= limit:
                    break
                if text.strip():
                    rows.append(parse_line(text, str(path), line_number))
    except UnicodeDecodeError as exc:
        raise BenchDataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not rows:
        raise BenchDataError(f"{path}: no rows")
    return rows


def load_all(paths: Iterable[str | Path], limit: int | None = None) -> list[BenchRow]:
    """Rows of several files, ``limit`` per file, checking that (task, id) pairs are unique."""
    rows: list[BenchRow] = []
    seen: dict[tuple[str, str], str] = {}
    for path in paths:
        for row in load_rows(path, limit):
            key = (row.task, row.id)
            if key in seen:
                raise BenchDataError(
                    f"{row.source}: duplicate task/id {row.task}/{row.id} (first at {seen[key]})"
                )
            seen[key] = row.source
            rows.append(row)
    return rows
