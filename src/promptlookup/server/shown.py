"""Which of a sequence's tokens its answer reports (in ``logprobs`` and ``usage``).

A generation's tokens end with the one that completed a stop string, when one did, but the
text is cut before that string. The answer reports the tokens whose text begins inside the
text it returns: so the token that completed the stop string, and any wholly inside it, are
in neither the text, the logprobs nor ``usage.completion_tokens``. Without a stop string every
token is reported, an EOS token included.

While streaming, a token is reported once the text shown so far reaches into it; at the end,
the rest of the reported ones follow. Streamed and whole answers report the same tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from ..generation import GenerationResult
from ..text import IncrementalDetokenizer


class ShownTokens:
    """One sequence's tokens and where each one's text begins, against the text shown."""

    def __init__(self, tokenizer, eos_token_ids: Sequence[int]) -> None:
        self._text = IncrementalDetokenizer(tokenizer)
        self._eos = frozenset(eos_token_ids)
        self._starts: list[int] = []  # where each token's text begins in the decoded text
        self._length = 0  # characters decoded so far
        self._shown = 0  # characters of the answer sent so far

    def add(self, token_ids: Iterable[int], piece: str = "") -> None:
        """Record new tokens, and ``piece``, the text now shown for them."""
        for token in token_ids:
            self._starts.append(self._length)
            self._length += len(self._text.add(token))
        self._shown += len(piece)

    def __len__(self) -> int:
        """How many tokens are recorded."""
        return len(self._starts)

    @property
    def shown(self) -> int:
        """How many tokens have text shown so far (a prefix of the tokens)."""
        return bisect.bisect_left(self._starts, self._shown)

    def reported(self, result: GenerationResult) -> int:
        """At the end: how many of ``result.token_ids`` the answer reports."""
        ids = result.token_ids
        if result.finish_reason != "stop" or not ids or ids[-1] in self._eos:
            return len(ids)  # no stop string cut the text
        self.add(ids[len(self) :])
        return bisect.bisect_left(self._starts, len(result.text))
