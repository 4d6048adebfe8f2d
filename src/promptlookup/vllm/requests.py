"""Which running request each row of vLLM's input batch holds, and its drafting state.

vLLM hands a custom proposer the batch's token rows (``token_ids_cpu[i, :num_tokens[i]]``) and
nothing that names the requests. Rows move when requests leave (the batch is condensed), join
(they take free rows) or are preempted (they leave and later come back, with the same tokens).
:class:`RequestTable` keeps one :class:`RequestState` per running request, found again every
step by request id when the caller knows it, else by content: a state fits a row when its
tokens are a prefix of the row's (checked on the first and last tokens it indexed, and the
length). A state nobody claimed this step has left the batch; it waits among the last
``keep_left`` such states, so a preempted request that comes back finds its index again.

A wrong match can only cost speed: drafts are verified by the model, so the output is the same
whatever the table decides. That is why a fingerprint check suffices.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..drafters.prompt_lookup import PromptLookupDrafter
from ..policy import AcceptanceModel

#: Tokens compared at each end of a state's tokens to decide that a row extends them.
FINGERPRINT = 8


@dataclass
class RequestState:
    """One running request: the tokens indexed so far (the drafter indexes this very list as it
    grows), its acceptance statistics, its last draft, and counts of what was drafted."""

    drafter: PromptLookupDrafter
    key: str | None = None
    sampling: bool = False
    tokens: list[int] = field(default_factory=list)
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    last_draft: list[int] = field(default_factory=list)
    last_match: int | None = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    reference_tokens: int = 0
    #: The request's prompt length and ``max_tokens`` (None: unknown, without vLLM's runner).
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    #: The proposer's step count when the request joined the batch (its cohort).
    first_step: int = 0

    def remaining(self, max_model_len: int) -> int | None:
        """Tokens the request may still produce (None when its limit is unknown)."""
        if self.prompt_tokens is None or self.max_tokens is None:
            return None
        produced = len(self.tokens) - self.prompt_tokens
        return max(0, min(self.max_tokens - produced, max_model_len - len(self.tokens)))

    def produced(self) -> int:
        """Tokens produced since its first decoding step (the prefill's token not counted)."""
        return max(0, len(self.tokens) - (self.prompt_tokens or 0) - 1)

    def fits(self, row, length: int) -> bool:
        """Whether the row's first ``length`` tokens start with this state's tokens."""
        have = len(self.tokens)
        if have > length:
            return False
        if have == 0:
            return True
        head = min(FINGERPRINT, have)
        return (
            row[:head].tolist() == self.tokens[:head]
            and row[have - head : have].tolist() == self.tokens[-head:]
        )

    def catch_up(self, row, length: int) -> None:
        """Append the row's tokens past those already indexed."""
        if length > len(self.tokens):
            self.tokens.extend(row[len(self.tokens) : length].tolist())


class RequestTable:
    """The states of the requests in the batch, matched to rows each step (see the module doc).

    ``new_state(key, row, length)`` builds the state of a request seen for the first time.
    """

    def __init__(self, new_state, keep_left: int = 32) -> None:
        self.new_state = new_state
        self.keep_left = keep_left
        self.rows: list[RequestState | None] = []  # by row, as of the last step
        self.left: OrderedDict[int, RequestState] = OrderedDict()  # by id(), oldest first
        self.created = 0  # states built from scratch (for tests and logs)
        self.resumed = 0  # states taken back after leaving the batch (preempted requests)

    def assign(
        self,
        num_rows: int,
        num_tokens: Sequence[int],
        token_ids,
        req_ids: Sequence[str | None] | None = None,
    ) -> list[tuple[RequestState, bool]]:
        """Each row's state for this step and whether it is new (built, or taken back from
        the states that had left, this step); rows' tokens are indexed up to ``num_tokens``."""
        previous = [state for state in self.rows if state is not None]
        by_key = {state.key: state for state in previous if state.key is not None}
        by_key.update({s.key: s for s in self.left.values() if s.key is not None})
        claimed: set[int] = set()
        result: list[tuple[RequestState, bool]] = []
        for i in range(num_rows):
            row, length = token_ids[i], int(num_tokens[i])
            key = req_ids[i] if req_ids is not None and i < len(req_ids) else None
            state, new = self._find(i, row, length, key, by_key, claimed)
            if state is None:
                state, new = self.new_state(key, row, length), True
                self.created += 1
            claimed.add(id(state))
            if self.left.pop(id(state), None) is not None:
                self.resumed += 1
            state.catch_up(row, length)
            result.append((state, new))
        for state in previous:  # left the batch: finished, aborted or preempted
            if id(state) not in claimed:
                state.last_draft, state.last_match = [], None
                self.left[id(state)] = state
        while len(self.left) > self.keep_left:
            self.left.popitem(last=False)
        self.rows = [state for state, _ in result]
        return result

    def _find(self, i, row, length, key, by_key, claimed) -> tuple[RequestState | None, bool]:
        """The state that fits row ``i``: by key when there is one, else the state that held
        this row last step, else the longest-indexed fitting state of the batch or of those
        that left. Returns (state, whether it was not in the batch last step)."""
        if key is not None:
            state = by_key.get(key)
            if state is None or id(state) in claimed or not state.fits(row, length):
                return None, True
            return state, id(state) in self.left
        if i < len(self.rows):
            state = self.rows[i]
            if state is not None and id(state) not in claimed and state.fits(row, length):
                return state, False
        candidates = [s for s in self.rows if s is not None] + list(self.left.values())
        fitting = [s for s in candidates if id(s) not in claimed and s.fits(row, length)]
        if not fitting:
            return None, True
        state = max(fitting, key=lambda s: len(s.tokens))
        return state, id(state) in self.left
