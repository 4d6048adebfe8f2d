"""Turning token streams into text: incremental detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Sequence


def eos_token_ids(*configured) -> list[int]:
    """The end-of-sequence ids of the first of ``configured`` that is not None (a config's or
    tokenizer's ``eos_token_id``: one id or a list of them); none when all are None.

    >>> eos_token_ids(None, 2), eos_token_ids([2, 7]), eos_token_ids(None)
    ([2], [2, 7], [])
    """
    eos = next((value for value in configured if value is not None), None)
    return [int(eos)] if isinstance(eos, int) else [int(token) for token in eos or ()]


class IncrementalDetokenizer:
    """Decodes a growing token list into text deltas without re-decoding everything, holding
    back text while the last tokens end inside a multi-byte character.

    The deltas concatenate to ``tokenizer.decode(ids, skip_special_tokens=True)``.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0  # decode from here to get context for the next delta
        self._read_offset = 0  # text of ids before this has been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (may be empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever text is still held back (an incomplete character at the very end)."""
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


class StopStrings:
    """Finds the first stop string in a growing text.

    ``feed(delta)`` returns the part of ``delta`` that may be shown, and sets ``stopped`` once a
    stop string appears; the stop string and anything after it are never returned. Text that
    could still become the start of a stop string is held back until it is decided.

    Policy: the first stop string is the one complete first (ending earliest; of two ending
    together, the one starting earliest), so the result does not depend on how the text is
    split into deltas: with stops ``["c", "abcd"]``, "abcd" stops at "ab" fed whole or one
    character at a time.

    >>> stops = StopStrings(["END"])
    >>> stops.feed("abc E"), stops.feed("N"), stops.feed("D tail"), stops.stopped
    ('abc ', '', '', True)
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = [s for s in stop if s]
        self.text = ""  # everything fed
        self._emitted = 0
        self.stopped = False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += delta
        hits = [
            (i + len(s), i) for s in self.stop for i in [self.text.find(s, search_from)] if i >= 0
        ]  # (end, start) of each stop string's first occurrence
        if hits:
            self.stopped = True
            return self._emit(min(hits)[1])
        return self._emit(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation: release text that was held back."""
        return "" if self.stopped else self._emit(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def _emit(self, upto: int) -> str:
        upto = max(upto, self._emitted)
        out = self.text[self._emitted : upto]
        self._emitted = upto
        return out
