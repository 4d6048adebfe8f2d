"""Prompt lookup: draft the tokens that followed the current suffix's earlier occurrence."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .base import Draft
from .suffix_index import SuffixIndex

#: Token placed between a reference text and the prompt in the index; never a real token.
SEPARATOR = -1


#: The draft source of drafts from the reference (a predicted output), which the policy keeps
#: statistics of its own for and the server counts as ``accepted_prediction_tokens``.
REFERENCE = "reference"


class PromptLookupDrafter:
    """Drafts by finding the sequence's current suffix earlier in the prompt or in the output.

    Policy: the longest suffix match of ``min_match`` to ``max_match`` tokens, ties broken by
    the most recent occurrence (see :mod:`promptlookup.drafters.suffix_index` for a worked
    example); the draft is what followed that occurrence, up to ``num_tokens`` tokens and cut
    just after an end-of-sequence token. *Chained lookup*: when that continuation runs into the
    end of the sequence, looking up again from the draft's own end finds the same occurrence
    one period later, so the draft repeats the continuation (``... a b c a b`` drafts
    ``c a b c ...``), which is what loops and repeated rows look like.

    >>> drafter = PromptLookupDrafter(num_tokens=3)
    >>> drafter.propose([1, 2, 3, 4, 5, 9, 1, 2], max_tokens=10)
    [3, 4, 5]
    >>> PromptLookupDrafter().propose([7, 1, 2, 1, 2], max_tokens=5)  # chained: period 2
    [1, 2, 1, 2, 1]

    Args:
        num_tokens: most tokens per draft (the loop may ask for fewer; the adaptive policy
            then trims the draft to what is worth verifying).
        min_match: shortest suffix worth matching.
        max_match: longest suffix compared (longer matches count as this long).
        eos_token_ids: tokens after which a draft stops.
        reference_ids: extra tokens to draft from besides the prompt (a "predicted output",
            e.g. the old version of a file being edited). They are indexed before the prompt,
            behind a separator no suffix can match across, so on equally long matches the
            prompt and output (more recent) win over the reference.
    """

    def __init__(
        self,
        num_tokens: int = 64,
        min_match: int = 1,
        max_match: int = 64,
        eos_token_ids: Iterable[int] = (),
        reference_ids: Sequence[int] = (),
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        self.num_tokens = num_tokens
        self.min_match = min_match
        self.max_match = max_match
        self.eos_token_ids = frozenset(eos_token_ids)
        self.reference_ids = list(reference_ids)
        self._source: object = None
        self._new_index()

    def sync(self, tokens: Sequence[int]) -> None:
        """Index ``tokens`` incrementally: O(new tokens) when it extends what was indexed (the
        same list object growing, as in the loop), else re-indexed once."""
        indexed = len(self.index) - self._offset
        if tokens is not self._source or len(tokens) < indexed:
            if len(tokens) < indexed or list(tokens[:indexed]) != self.index.tokens[self._offset :]:
                self._new_index()
                indexed = 0
            self._source = tokens
        self.index.extend(tokens[indexed:])

    def _new_index(self) -> None:
        self.index = SuffixIndex(self.min_match, self.max_match)
        if self.reference_ids:
            self.index.extend([*self.reference_ids, SEPARATOR])
        self._offset = len(self.index)

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        self.sync(tokens)
        match = self.index.match()
        if match is None:
            return Draft()
        limit = min(max_tokens, self.num_tokens)
        draft = self.index.continuation(match, limit)
        if match.end + len(draft) == len(self.index) and draft:  # chained lookup: repeat
            draft = (draft * (limit // len(draft) + 1))[:limit]
        for i, token in enumerate(draft):
            if token == SEPARATOR:
                draft = draft[:i]
                break
            if token in self.eos_token_ids:
                draft = draft[: i + 1]
                break
        # A draft that continues inside the reference (a predicted output) is its source's.
        source = REFERENCE if self.reference_ids and match.end < self._offset else None
        return Draft(draft, match_length=match.length, source=source)

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        extra = f", reference_ids=<{len(self.reference_ids)} tokens>" if self.reference_ids else ""
        return (
            f"PromptLookupDrafter(num_tokens={self.num_tokens}, min_match={self.min_match}, "
            f"max_match={self.max_match}{extra})"
        )
