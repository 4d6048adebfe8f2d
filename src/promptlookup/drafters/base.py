"""The drafter protocol and its simplest members.

A *drafter* guesses the next tokens cheaply; the target model then checks the guess (the
*draft*) in one forward pass. The protocol has two methods, like ``transformers``' candidate
generator:

- ``propose(tokens, max_tokens)``: up to ``max_tokens`` draft tokens continuing ``tokens`` (the
  prompt plus every accepted token so far). An empty list means "no guess": the loop then runs
  a plain decoding step.
- ``update(draft, num_accepted)``: how many leading tokens of the last draft the target
  accepted, for drafters that learn or keep state (a draft model's cache).

Within one generation the loop passes the same growing list object to every ``propose``
call, so drafters can index it incrementally. Drafters are torch-free unless they wrap a model.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, Sequence, runtime_checkable


@runtime_checkable
class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` draft tokens that may follow ``tokens``."""

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        """The target accepted the first ``num_accepted`` tokens of ``draft``."""


class NoDrafter:
    """Never drafts: the loop becomes plain decoding (one token per forward pass)."""

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        return []

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        return "NoDrafter()"


class CallableDrafter:
    """Any function ``f(tokens, max_tokens) -> list[int]`` (or ``f(tokens)``) as a drafter.

    >>> drafter = CallableDrafter(lambda tokens: [tokens[-1]] * 3)  # guess "repeat the last"
    >>> drafter.propose([5, 7], max_tokens=2)
    [7, 7]

    ``generate`` wraps a plain function itself; a wrong guess costs nothing but time:

    >>> def repeat_last_four(tokens):           # draft: the last 4 tokens once more
    ...     return list(tokens[-4:])
    >>> lm.generate("Write 'la la la' ten times.", chat=True,
    ...             drafter=repeat_last_four)                            # doctest: +SKIP
    """

    def __init__(self, function: Callable[..., Sequence[int]]) -> None:
        self.function = function
        try:
            import inspect

            params = inspect.signature(function).parameters.values()
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            self._takes_max = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
        except (TypeError, ValueError):
            self._takes_max = False

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        draft = self.function(tokens, max_tokens) if self._takes_max else self.function(tokens)
        return [int(t) for t in list(draft or [])[:max_tokens]]

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"CallableDrafter({getattr(self.function, '__name__', self.function)!r})"


class ChainDrafter:
    """Asks each drafter in turn; the next one only when the previous proposed fewer than
    ``min_tokens`` tokens. The first non-empty-enough draft wins; only its author is updated
    (the others get ``update([], 0)``; a draft model catches up on its next ``propose``).
    E.g. ``"prompt-lookup,draft-model:PATH"``: the draft model drafts only where prompt lookup
    finds no match.

    >>> chain = ChainDrafter([NoDrafter(), CallableDrafter(lambda t: [1, 2])])
    >>> chain.propose([0], 4)
    [1, 2]
    """

    def __init__(self, drafters: Sequence[Drafter], min_tokens: int = 1) -> None:
        if not drafters:
            raise ValueError("a chain needs at least one drafter")
        self.drafters = list(drafters)
        self.min_tokens = min_tokens
        self._author: Drafter | None = None

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        best: list[int] = []
        self._author = None
        for drafter in self.drafters:
            draft = drafter.propose(tokens, max_tokens)
            if len(draft) > len(best):
                best, self._author = draft, drafter
            if len(best) >= min(self.min_tokens, max_tokens):
                break
        return best

    @property
    def last_draft_probs(self):
        """The draft distributions of the drafter that authored the last draft, if it sampled
        its draft (see :mod:`promptlookup.rejection`); None otherwise."""
        return getattr(self._author, "last_draft_probs", None)

    @property
    def last_match(self):
        """The suffix match behind the last draft, if its author reports one."""
        return getattr(self._author, "last_match", None)

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        for drafter in self.drafters:
            drafter.update(draft if drafter is self._author else [], num_accepted if drafter is self._author else 0)

    def __repr__(self) -> str:
        return f"ChainDrafter({self.drafters!r})"


def drafter_members(drafter: Drafter) -> Iterator[Drafter]:
    """``drafter`` itself, then every member of its chains, depth first."""
    yield drafter
    for member in getattr(drafter, "drafters", ()):
        yield from drafter_members(member)
