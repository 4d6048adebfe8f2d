"""A cross-request index: what the model wrote for earlier requests, as drafts for later ones.

Agent loops, coding assistants and batch jobs send many requests whose answers repeat each
other in structure (the same JSON skeleton, tool-call format or test boilerplate). A
:class:`CrossRequestIndex` kept across generations remembers recent outputs (and optionally
prompts) as *documents*, and :class:`SharedLookupDrafter` drafts from it where the request's own
context has nothing as good.

Data structure
--------------
An n-gram table of continuation counts: for every *order* ``n`` in ``orders`` (default 1, 2,
3, 4, 6, 8, 12, 16, 32) and every position of a document, the ``n`` tokens before it (by their
hash: a collision could only merge two n-grams' counts, i.e. worse drafts) map to a count of
each token that followed them. Adding a token updates one entry per order, and
evicting a token undoes that, so both cost O(len(orders)) whatever the index holds. A lookup
takes the longest order whose last ``n`` tokens of the request occur, and the continuation
seen most often after them (ties: the one counted last); a draft repeats that, one token at a
time, from the request's context extended by the draft so far.

Bounds and eviction
-------------------
The index holds at most ``max_tokens`` tokens (documents' tokens, the prompt tails that start
them included), so at most ``len(orders) * max_tokens`` table entries. When a new token would
exceed the budget, the oldest documents (by when they were opened) are evicted whole, their
counts removed. A document evicted while still being written (a generation longer than the
budget leaves room for) goes on as a new document from its next token.

Thread safety: every method takes the index's lock, so generations in several threads (or the
server's batch decoder beside a caller) may share one index.

Exactness: a draft is only a guess that the target verifies (:mod:`promptlookup.loop`), so
what the index holds can change speed, never a token.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import InvalidParameterError
from .base import Draft

#: Tokens a cross-request index holds by default (the oldest documents evicted whole).
INDEX_TOKENS = 32768
#: The draft source of drafts from a cross-request index (the policy's statistics key).
SHARED = "shared"
#: The n-gram lengths indexed by default.
DEFAULT_ORDERS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


class Document:
    """One output (with the prompt tokens before it) as the index holds it; a handle for
    :meth:`CrossRequestIndex.extend`. ``tokens``: what the index holds of it now."""

    __slots__ = ("tokens", "alive")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.alive = False


class CrossRequestIndex:
    """Recent outputs of a model, bounded by ``max_tokens``, for drafting across requests.

    >>> index = CrossRequestIndex(max_tokens=1000)
    >>> index.add([5, 6, 7, 8, 9])               # an earlier output
    >>> index.draft([1, 2, 6, 7], max_tokens=3)  # the context ends as it did: draft what followed
    [8, 9]
    >>> index.draft([1, 2, 6, 7], 3).match_length, len(index)
    (2, 5)

    Keep one across :meth:`~promptlookup.LanguageModel.generate` calls and pass it as
    ``cross_request=index``: each generation adds its output as it is accepted, with the last
    ``max(orders)`` prompt tokens before it (the whole prompt with ``include_prompts``).

    Args:
        max_tokens: the token budget (see the module doc for the eviction rule).
        orders: the n-gram lengths indexed; lookups match at most ``max(orders)`` tokens.
        include_prompts: index whole prompts, not only the tail that leads into the output.
    """

    def __init__(
        self,
        max_tokens: int = INDEX_TOKENS,
        orders: Sequence[int] = DEFAULT_ORDERS,
        include_prompts: bool = False,
    ) -> None:
        orders = sorted(set(orders))
        if not orders or orders[0] < 1 or any(not isinstance(n, int) for n in orders):
            raise InvalidParameterError(f"orders must be integers >= 1, got {orders!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.orders = tuple(orders)
        self.max_order = self.orders[-1]
        self.include_prompts = include_prompts
        # hash of n tokens -> what followed them (see _Counts).
        self._table: dict[int, int | dict[int, int]] = {}
        self._documents: collections.deque[Document] = collections.deque()  # oldest first
        self._size = 0
        self._lock = threading.RLock()

    # -- adding and evicting ------------------------------------------------------------------

    def open(self, context: Sequence[int] = ()) -> Document:
        """Start a document (a generation's output) whose first tokens follow ``context``
        (its prompt): the whole context with ``include_prompts``, else its last
        ``max(orders)`` tokens are held as the document's start."""
        document = Document()
        start = list(context) if self.include_prompts else list(context[-self.max_order :])
        self.extend(document, start)
        return document

    def extend(self, document: Document, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to ``document`` (accepted tokens, in order)."""
        with self._lock:
            for token in tokens:
                self._append(document, int(token))

    def add(self, tokens: Sequence[int], context: Sequence[int] = ()) -> None:
        """Add a whole output at once (after ``context``, as in :meth:`open`)."""
        with self._lock:
            self.extend(self.open(context), tokens)

    def _append(self, document: Document, token: int) -> None:
        if not document.alive:  # new, or evicted while being written: (re)join as the newest
            document.tokens, document.alive = [], True
            self._documents.append(document)
        if not 0 <= token <= _TOKEN:
            raise InvalidParameterError(f"token ids must be in 0..{_TOKEN}, got {token}")
        tokens, table = document.tokens, self._table
        position = len(tokens)
        tokens.append(token)
        # One count per order: the n tokens before this one were followed by it.
        for n in self.orders:
            if n > position:
                break
            key = hash(tuple(tokens[position - n : position]))
            counts = table.get(key)
            if counts is None:
                table[key] = _ONE | token
            elif type(counts) is int:
                if counts & _TOKEN == token:
                    table[key] = counts + _ONE
                else:
                    table[key] = {counts & _TOKEN: counts >> 32, token: 1}
            else:
                counts[token] = counts.pop(token, 0) + 1  # moved last: the latest on a tie
        self._size += 1
        while self._size > self.max_tokens:
            self._evict(self._documents.popleft())

    def _evict(self, document: Document) -> None:
        """Remove a document's counts (the oldest document, whole)."""
        tokens, table = document.tokens, self._table
        for position in range(1, len(tokens)):
            token = tokens[position]
            for n in self.orders:
                if n > position:
                    break
                key = hash(tuple(tokens[position - n : position]))
                counts = table[key]
                if type(counts) is int:
                    if counts >= 2 * _ONE:
                        table[key] = counts - _ONE
                    else:
                        del table[key]
                elif counts[token] > 1:
                    counts[token] -= 1
                else:
                    del counts[token]
                    if len(counts) == 1:  # one continuation left: packed again
                        ((last, count),) = counts.items()
                        table[key] = count << 32 | last
        self._size -= len(tokens)
        document.tokens, document.alive = [], False

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            for document in self._documents:
                document.tokens, document.alive = [], False
            self._documents.clear()
            self._table.clear()
            self._size = 0

    # -- looking up ---------------------------------------------------------------------------

    def lookup(self, context: Sequence[int], min_match: int = 1) -> tuple[int, dict[int, int]]:
        """The longest order ``n >= min_match`` whose last ``n`` tokens of ``context`` occur,
        with the counts of what followed them: ``(n, {token: count})``; ``(0, {})`` if none."""
        with self._lock:
            for n in reversed(self.orders):
                if n < min_match:
                    break
                if n <= len(context):
                    counts = self._table.get(hash(tuple(context[len(context) - n :])))
                    if counts is not None:
                        return n, _as_dict(counts)
            return 0, {}

    def draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        min_match: int = 1,
        stop_tokens: Iterable[int] = (),
    ) -> Draft:
        """Up to ``max_tokens`` tokens after ``context``: at each step the most frequent
        continuation of the longest match (at least ``min_match`` tokens) of the context
        extended by the draft so far, cut after a token of ``stop_tokens``.
        ``match_length``: the first step's match; ``source``: ``"shared"``."""
        stops = frozenset(stop_tokens)
        with self._lock:
            window = list(context[max(0, len(context) - self.max_order) :])
            tokens, first = [], None
            while len(tokens) < max_tokens:
                # The longest match of the window, and its most frequent continuation.
                length, counts = self._longest(window, min_match)
                if not length:
                    break
                first = first or length
                token = _most_frequent(counts)
                tokens.append(token)
                if token in stops:
                    break
                # The window moves on by the drafted token.
                window.append(token)
                if len(window) > self.max_order:
                    del window[0]
        return Draft(tokens, match_length=first, source=SHARED)

    def _longest(self, window: list[int], min_match: int) -> tuple[int, int | dict | None]:
        for n in reversed(self.orders):
            if n < min_match:
                break
            if n <= len(window):
                counts = self._table.get(hash(tuple(window[len(window) - n :])))
                if counts is not None:
                    return n, counts
        return 0, None

    # -- what it holds ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Tokens held (at most ``max_tokens``)."""
        return self._size

    @property
    def entries(self) -> int:
        """Distinct n-grams held (at most ``len(orders) * max_tokens``)."""
        return len(self._table)

    @property
    def documents(self) -> list[list[int]]:
        """The documents held, oldest first (copies of their tokens)."""
        with self._lock:
            return [list(document.tokens) for document in self._documents]

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to a JSON file: its settings and documents' token ids."""
        with self._lock:
            data = {
                "format": "promptlookup-cross-request-1",
                "max_tokens": self.max_tokens,
                "orders": list(self.orders),
                "include_prompts": self.include_prompts,
                "documents": self.documents,
            }
        Path(path).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike, max_tokens: int | None = None) -> CrossRequestIndex:
        """An index read from :meth:`save`'s file (``max_tokens`` overrides the saved budget;
        a smaller one keeps the newest documents that fit)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if data.get("format") != "promptlookup-cross-request-1":
                raise ValueError("not a cross-request index file")
            index = cls(max_tokens or data["max_tokens"], data["orders"], data["include_prompts"])
            for tokens in data["documents"]:
                index.extend(Document(), [int(token) for token in tokens])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidParameterError(f"cannot load cross-request index {path}: {exc}") from None
        return index

    def __repr__(self) -> str:
        return (
            f"CrossRequestIndex(max_tokens={self.max_tokens}, tokens={self._size}, "
            f"documents={len(self._documents)}, entries={len(self._table)})"
        )


# What followed an n-gram: one token and its count packed in an int (``count << 32 | token``;
# most n-grams have one continuation), else a dict {token: count} in the order the counts
# last rose.
_TOKEN = (1 << 32) - 1
_ONE = 1 << 32


def _as_dict(counts: int | dict[int, int]) -> dict[int, int]:
    return {counts & _TOKEN: counts >> 32} if type(counts) is int else dict(counts)


def _most_frequent(counts: int | dict[int, int]) -> int:
    """The token counted most often; on a tie, the one whose count rose last."""
    if type(counts) is int:
        return counts & _TOKEN
    best, best_count = -1, 0
    for token, count in counts.items():
        if count >= best_count:
            best, best_count = token, count
    return best
