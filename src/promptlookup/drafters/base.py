"""The drafter protocol and its simplest members.

A *drafter* guesses the next tokens cheaply; the target model then checks the guess (the
*draft*) in one forward pass. The protocol has two methods, like ``transformers``' candidate
generator, and they are the loop's whole contract with a drafter:

- ``propose(tokens, max_tokens)``: up to ``max_tokens`` draft tokens continuing ``tokens`` (the
  prompt plus every accepted token so far), as a :class:`Draft` (a list of tokens that may also
  carry the distributions it was sampled from and the suffix-match length that found it) or a
  plain list. An empty draft means "no guess": the loop then runs a plain decoding step.
- ``update(draft, num_accepted)``: how many leading tokens of the last draft the target
  accepted, for drafters that learn or keep state (a draft model's cache).

What a drafter needs from the generation (a draft model: its sampler and the speculation
policy) it receives through :func:`bind_generation`: the sampler when it is built
(:func:`promptlookup.make_drafter` passes ``chooser``), the policy from the sequence it drafts
for.

Within one generation the loop passes the same growing list object to every ``propose``
call, so drafters can index it incrementally. Drafters are torch-free unless they wrap a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable


class Draft(list):
    """The draft tokens of one step (a ``list[int]``), with what the loop may need besides:

    - ``draft_probs``: the distributions the tokens were sampled from, a tensor
      ``(len(draft), vocab)``, for drafters that sample (the loop then verifies with the
      speculative-sampling rejection rule, :mod:`promptlookup.rejection`); None otherwise.
    - ``match_length``: the length of the suffix match that found the draft (prompt lookup);
      the speculation policy trusts longer matches more. None when there is no such thing.
    - ``source``: where the draft came from when a drafter has several sources (``"shared"``:
      a :class:`~promptlookup.drafters.cross_request.CrossRequestIndex`); the policy keeps
      acceptance statistics per source. None: the request's own context.
    - ``forced``: how many leading tokens a grammar forces (:mod:`promptlookup.grammar`):
      sure to be accepted, and not the drafter's to learn from. 0 without a grammar.

    >>> draft = Draft([4, 5, 6], match_length=2, forced=3)
    >>> draft == [4, 5, 6], draft.cut(2), draft.cut(2).match_length, draft.cut(2).forced
    (True, [4, 5], 2, 2)
    >>> Draft.of([7, 8]).match_length is None    # a plain list: tokens only
    True
    """

    def __init__(
        self,
        tokens: Iterable[int] = (),
        draft_probs=None,
        match_length: int | None = None,
        source: str | None = None,
        forced: int = 0,
    ) -> None:
        super().__init__(tokens)
        self.draft_probs = draft_probs  # (len(self), vocab) or None
        self.match_length = match_length
        self.source = source
        self.forced = min(forced, len(self))

    @classmethod
    def of(cls, proposed: Sequence[int] | None) -> Draft:
        """What ``propose`` returned, as a :class:`Draft` (itself when it already is one)."""
        return proposed if isinstance(proposed, Draft) else cls(proposed or ())

    def cut(self, length: int) -> Draft:
        """The first ``length`` tokens, with their rows of ``draft_probs``."""
        if length >= len(self):
            return self
        length = max(length, 0)
        probs = self.draft_probs[:length] if self.draft_probs is not None else None
        return Draft(self[:length], probs, self.match_length, self.source, self.forced)

    def __repr__(self) -> str:
        return list.__repr__(self)


@runtime_checkable
class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft | list[int]:
        """Up to ``max_tokens`` draft tokens that may follow ``tokens``."""

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        """The target accepted the first ``num_accepted`` tokens of ``draft``."""


class NoDrafter:
    """Never drafts: the loop becomes plain decoding (one token per forward pass)."""

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        return Draft()

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
            positional = [
                p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            self._takes_max = len(positional) >= 2 or any(
                p.kind == p.VAR_POSITIONAL for p in params
            )
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

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        best = Draft()
        self._author = None
        for drafter in self.drafters:
            draft = Draft.of(drafter.propose(tokens, max_tokens))
            if len(draft) > len(best):
                best, self._author = draft, drafter
            if len(best) >= min(self.min_tokens, max_tokens):
                break
        return best  # its author's Draft: draft probabilities and match length included

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        for drafter in self.drafters:
            drafter.update(
                draft if drafter is self._author else [],
                num_accepted if drafter is self._author else 0,
            )

    def __repr__(self) -> str:
        return f"ChainDrafter({self.drafters!r})"


def drafter_members(drafter: Drafter) -> Iterator[Drafter]:
    """``drafter`` itself, then every member of its chains, depth first."""
    yield drafter
    if isinstance(drafter, ChainDrafter):
        for member in drafter.drafters:
            yield from drafter_members(member)


def bind_generation(drafter: Drafter, *, chooser=None, policy=None) -> None:
    """Hand one generation's sampler and speculation policy to the members of a drafter
    object that was built before it (members of chains included). A drafter takes part by
    declaring the attributes: ``chooser`` (a draft model samples its drafts with the
    generation's :class:`~promptlookup.sampling.TokenChooser`) and ``policy`` (the sequence's
    :class:`~promptlookup.policy.Speculation`: a drafter that pays for each draft token sizes
    its drafts by their cost, one with several sources compares their drafts). Each is kept
    where it is None."""
    for member in drafter_members(drafter):
        if chooser is not None and hasattr(member, "chooser"):
            member.chooser = chooser
        if policy is not None and hasattr(member, "policy"):
            member.policy = policy
