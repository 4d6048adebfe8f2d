"""What a request may carry that the server does not use, and the one rule for it on every
API (chat completions, Messages, Responses), as llama-server does: ignored, and said.

- A field no model of the request declares (at any depth: the body, a message, a block, a
  tool) is *ignored*: it is listed, by its path, in the response header
  ``x-promptlookup-ignored-fields`` and in a warning log line.
- Unless it is a *typo*: a name within edit distance 1 (2 from 8 characters on; case aside) of
  a field declared at the same place is a 400 naming the intended field
  (``max_token`` -> ``max_tokens``), as is a tool ``type`` that close to one the API serves;
  other servers' fields near ours (:data:`NOT_TYPOS`) are only ignored.
- A *tool the server cannot run* (hosted and server tools: web search, code execution, ...)
  is left out of the prompt, listed as ``path (type)`` in ``x-promptlookup-ignored-tools``
  and the log line; content the prompt leaves out by design (earlier server-tool results) is
  listed with the fields.

Parsing (:func:`check_extras`, from :func:`.request_base.parse_request`) notes into the
request's :class:`Ignored`, which the edge (:class:`.edge.APIKeyGate`) made and turns into the
headers (:func:`collecting`).
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from pydantic import BaseModel

log = logging.getLogger("promptlookup.server")

FIELDS_HEADER = "x-promptlookup-ignored-fields"
TOOLS_HEADER = "x-promptlookup-ignored-tools"
#: The most characters of one header's value (the rest counted, not listed).
MAX_HEADER_CHARS = 2000
#: How many distinct ignored-field lists are logged at warning level (then at debug).
LOGGED_KINDS = 256
#: Fields other servers define that are near one of ours, so never typos (only ignored):
#: vLLM's ``min_tokens``, OpenRouter's ``top_a`` and ``models``, Anthropic's ``speed``.
NOT_TYPOS = frozenset({"min_tokens", "top_a", "models", "speed"})


class LeftOut(BaseModel):
    """A part of a request the prompt leaves out: its ``type`` is said back, its fields are
    not searched (see :func:`check_extras`). ``kind``: ``"tools"`` or ``"fields"``."""

    kind: ClassVar[str] = "fields"


class Ignored:
    """What one request's parsing ignored: field paths, and tools left out."""

    def __init__(self) -> None:
        self.fields: list[str] = []
        self.tools: list[str] = []

    def headers(self) -> list[tuple[bytes, bytes]]:
        pairs = [(FIELDS_HEADER, self.fields), (TOOLS_HEADER, self.tools)]
        return [(name.encode(), _header_value(items)) for name, items in pairs if items]


_CURRENT: contextvars.ContextVar[Ignored | None] = contextvars.ContextVar(
    "promptlookup_ignored", default=None
)
_logged: set[tuple[str, ...]] = set()


@contextmanager
def collecting() -> Iterator[Ignored]:
    """The :class:`Ignored` of the request handled within (parsing notes into it)."""
    ignored = Ignored()
    token = _CURRENT.set(ignored)
    try:
        yield ignored
    finally:
        _CURRENT.reset(token)
        if ignored.fields or ignored.tools:
            _log(ignored)


def note(kind: str, entry: str) -> None:
    """Note an ignored field path (``kind`` ``"fields"``) or a tool left out (``"tools"``)."""
    ignored = _CURRENT.get()
    if ignored is not None:
        getattr(ignored, kind).append(entry)


class Typo(ValueError):
    """A field (or tool type) that is a typo of one this server implements."""

    def __init__(self, path: str, intended: str) -> None:
        super().__init__(f"{path}: unknown field; did you mean {intended!r}?")
        self.path = path


def check_extras(model: BaseModel) -> None:
    """Walk a validated request: a :class:`Typo` for the first misspelt field, every other
    undeclared field noted as ignored, every :class:`LeftOut` part noted by its type."""
    for path, name, owner in _extras(model, ()):
        where = ".".join(map(str, path))
        if isinstance(owner, LeftOut):
            note(owner.kind, f"{where} ({getattr(owner, 'type', None) or name})")
            continue
        intended = close_name(name, _declared(type(owner)))
        if intended is not None:
            raise Typo(where, intended)
        note("fields", where)


def check_type(value: str, served: tuple[str, ...]) -> None:
    """A ``ValueError`` (in a validator: the field's 400) where a tool's ``type`` is a near
    miss of one of ``served``."""
    intended = None if value in served else close_name(value, served)
    if intended is not None:
        raise ValueError(f"unknown type {value!r}; did you mean {intended!r}?")


def close_name(name: str, known) -> str | None:
    """The declared name ``name`` is a typo of, if any (see the module doc)."""
    if len(name) < 4 or name in NOT_TYPOS:
        return None
    limit = 1 if len(name) < 8 else 2
    lowered = name.lower()
    for candidate in known:
        if candidate != name and distance(lowered, candidate.lower()) <= limit:
            return candidate
    return None


def distance(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (optimal string alignment).

    >>> distance("max_token", "max_tokens"), distance("temprature", "temperature")
    (1, 1)
    >>> distance("tpo_p", "top_p"), distance("store", "stop")
    (1, 2)
    """
    if abs(len(a) - len(b)) > 2:
        return 3  # more than any limit
    before, row = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            cost = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (x != y))
            if before is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, row = row, current
    return row[-1]


def _declared(cls: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in cls.model_fields.items()]


def _extras(value, path: tuple) -> Iterator[tuple[tuple, str, BaseModel]]:
    """``(path, name, the model it is in)`` of every undeclared field, and of every
    :class:`LeftOut` part (its path, its type as the name)."""
    if isinstance(value, LeftOut):
        yield path, "", value
    elif isinstance(value, BaseModel):
        for name in value.model_extra or {}:
            yield (*path, name), name, value
        for name, field in type(value).model_fields.items():
            yield from _extras(getattr(value, name), (*path, field.alias or name))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if isinstance(item, (BaseModel, list, tuple)):
                yield from _extras(item, (*path, index))


_UNSAFE = re.compile(r"[^\x20-\x7e]|,")


def _escape(match: re.Match) -> str:
    character = match.group()
    return "\\x2c" if character == "," else ascii(character)[1:-1]


def _header_value(items: list[str]) -> bytes:
    """``items`` as one header value: printable ASCII (others escaped), comma-separated, at
    most :data:`MAX_HEADER_CHARS` characters."""
    safe = [_UNSAFE.sub(_escape, item) for item in items]
    value, shown = "", 0
    for item in safe:
        if len(value) + len(item) + 2 > MAX_HEADER_CHARS:
            break
        value, shown = (f"{value}, {item}" if value else item), shown + 1
    if shown < len(safe):
        value += f" (and {len(safe) - shown} more)"
    return value.encode("ascii")


def _log(ignored: Ignored) -> None:
    key = (*ignored.fields, "|", *ignored.tools)
    first = key not in _logged and len(_logged) < LOGGED_KINDS
    if first:
        _logged.add(key)
    level = logging.WARNING if first else logging.DEBUG
    fields = _header_value(ignored.fields).decode() or "none"
    tools = _header_value(ignored.tools).decode() or "none"
    log.log(level, "request: ignored fields: %s; tools left out: %s", fields, tools)
