"""An incremental index of a token sequence that finds, after every appended token, the
longest earlier occurrence of the sequence's current suffix.

Matching policy (what :meth:`SuffixIndex.match` returns)
-------------------------------------------------------
*Longest suffix match, between ``min_match`` and ``max_match`` tokens, ties broken by the most
recent occurrence.*  Of all suffixes of the sequence with length in ``[min_match, max_match]``
that also occur ending at an earlier position, take the longest; among that suffix's earlier
occurrences take the one that ends latest. The continuation (the draft) starts right after it.

Worked example, ``min_match=1, max_match=3``, tokens (as letters) ``a b c x a b c y a b c``:

- the suffix ``a b c`` (length 3 = ``max_match``) occurred ending at positions 3 and 7
  (1-based ends); the most recent is 7, so the continuation starts at index 7: ``y a b c``.
- Appending ``z`` gives suffix ``... c z``: ``z`` never occurred before, so there is no match.

Data structure
--------------
A suffix automaton (Blumer et al.) over the whole sequence, built online in amortised O(1) per
token. Each state also stores ``last_end``: the latest end position of its strings *before* the
current end. Only states holding some suffix of length <= ``max_match`` are ever queried, and those
form the bottom of the current suffix-link path: a pointer to its top (``_tail``, the state of the
suffix of length ``min(n, max_match)``) is kept in amortised O(1), and the walk that refreshes
``last_end`` visits at most ``max_match`` states. So appending a token and matching cost
O(max_match) at worst and do not grow with the length of the sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Match(NamedTuple):
    """An earlier occurrence of the current suffix: ``length`` tokens ending at ``end``
    (exclusive index), so the continuation starts at ``tokens[end]``."""

    length: int
    end: int


class SuffixIndex:
    """Suffix automaton over ``tokens`` with most-recent-occurrence tracking.

    >>> index = SuffixIndex(min_match=1, max_match=3)
    >>> index.extend([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3])
    >>> index.match()
    Match(length=3, end=7)
    >>> index.continuation(index.match(), 4)
    [8, 1, 2, 3]
    """

    def __init__(self, min_match: int = 1, max_match: int = 64) -> None:
        if min_match < 1 or max_match < min_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.tokens: list[int] = []
        # Automaton states, as parallel lists. State 0 is the root (the empty string).
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._last_end: list[int] = [0]
        self._last = 0  # state of the whole sequence
        self._tail = 0  # state of the suffix of length min(n, max_match)
        self._match: Match | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token and update the current match."""
        self.tokens.append(token)
        n = len(self.tokens)
        cur = self._add_state(n, last_end=0)
        self._extend_automaton(token, cur)
        self._advance_tail(token, n)
        # The longest suffix with an earlier occurrence: the tail itself unless it is the new
        # state (whose only occurrence is now), else the suffix-link parent of the new state.
        if self._tail != cur:
            state, length = self._tail, min(n, self.max_match)
        else:
            state = self._link[cur]
            length = self._len[state]
        self._match = Match(length, self._last_end[state]) if length >= self.min_match else None
        # Record this occurrence on every state that holds a suffix of length <= max_match.
        state = self._tail
        while state > 0 and self._len[state] >= self.min_match:
            self._last_end[state] = n
            state = self._link[state]

    def match(self) -> Match | None:
        """The current match under the policy above, or None."""
        return self._match

    def continuation(self, match: Match, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed ``match``'s occurrence."""
        return self.tokens[match.end : match.end + max_tokens]

    # -- automaton internals ------------------------------------------------------------------

    def _add_state(self, length: int, last_end: int) -> int:
        self._next.append({})
        self._link.append(-1)
        self._len.append(length)
        self._last_end.append(last_end)
        return len(self._len) - 1

    def _extend_automaton(self, token: int, cur: int) -> None:
        nxt, link, length = self._next, self._link, self._len
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = self._add_state(length[p] + 1, last_end=self._last_end[q])
                nxt[clone] = dict(nxt[q])
                link[clone] = link[q]
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur

    def _advance_tail(self, token: int, n: int) -> None:
        """Move ``_tail`` to the state of the suffix of length ``min(n, max_match)``."""
        want = min(n, self.max_match)
        have = want - 1  # we extend the previous sequence's suffix of this length by `token`
        state = self._tail
        # The old tail holds a suffix of length >= have; a clone may also have split it.
        while state > 0 and have <= self._len[self._link[state]]:
            state = self._link[state]
        # The transition by `token` leads to the state of that suffix plus `token`.
        self._tail = self._next[state][token]
