"""The bottleneck rule: which rows of vLLM's batch are worth drafting for.

promptlookup's policy (:meth:`~promptlookup.policy.SpeculationPolicy.decide`)
values a pass by its tokens per second, ``(B + sum_i E_i[accepted]) / cost``: right when every
token is worth the same, as in a server whose freed slots are refilled (from a queue, or by
clients that send their next request). A batch of requests sent together and awaited together
is different: it lasts as many steps as its slowest request, so a token accepted for a request
that will finish ahead of the others saves nothing but that row's share of later steps, while
its draft makes this step dearer for every row (`benchmarks/runs/vllm-0.32.0/probe/x8.txt`, in
git at 4980f63: 8 open-ended requests, 94-96 steps with drafts against 96 without, each drafted
step about 10% dearer).

The rule, for a pass over ``B >= 2`` decoding rows whose requests joined the batch together
(:func:`one_cohort`: within ``COHORT_STEPS`` engine steps of each other) and whose remaining
tokens are known: each row's projected steps to its end are ``remaining / pace`` (its tokens
per step so far, smoothed); the rows within ``SLACK`` steps of the longest projection set the
batch's length (the *bottleneck*) and keep their full weight; every other row's gains are
weighted by ``OTHERS`` (0: no drafts for rows that are ahead). The weighted gains go through the
policy's own merge (``decide(..., weights=)``: largest first, the best prefix by
tokens per second), so the pass's cost is
judged as before, and a bottleneck row whose drafts do not pay gets none, and then no row
drafts. With one row, rows that joined at different times (slots being refilled), or a row
whose remaining tokens are unknown, every weight is 1: the policy's own rule, unchanged.

Rows drafting from a prediction keep weight 1: their drafts are nearly always accepted, and a
batch whose rows all carry predictions should draft long for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "RowPace",
    "bottleneck_weights",
    "one_cohort",
    "projected_steps",
]

#: Requests that joined the batch within this many engine steps of each other are one cohort.
COHORT_STEPS = 8
#: Rows within this many projected steps of the longest one are the batch's bottleneck.
SLACK = 2.0
#: Weight of the gains of rows ahead of the bottleneck (0: they draft nothing).
OTHERS = 0.0
#: Whether the bottleneck's ``m`` rows weigh ``B / m`` each (a token accepted for the one row
#: that sets the batch's length saves a step of all ``B`` rows) rather than 1.
SCALE = False


@dataclass(frozen=True)
class RowPace:
    """What the rule knows of one decoding row: the tokens its request may still produce
    (None: unknown), the tokens it produced since its first decoding step and in how many
    steps, and whether it drafts from a prediction."""

    remaining: int | None
    produced: int = 0
    steps: int = 0
    predicted: bool = False


def one_cohort(first_steps: Sequence[int], window: int = COHORT_STEPS) -> bool:
    """Whether the rows' requests joined the batch together (their first engine steps within
    ``window`` of each other): a batch sent at once, that lasts as long as its slowest
    request. A request that joined later means a server whose freed slots are refilled, where
    every token is worth the same and the policy's own rule applies.

    >>> one_cohort([3, 4, 9]), one_cohort([3, 40])
    (True, False)
    """
    return bool(first_steps) and max(first_steps) - min(first_steps) <= window


def projected_steps(pace: RowPace) -> float:
    """Steps the row still needs at its pace so far: ``remaining / ((produced + 1) / (steps
    + 1))`` (a row that has not decoded yet: one token a step).

    >>> projected_steps(RowPace(remaining=90, produced=29, steps=9))
    30.0
    """
    assert pace.remaining is not None
    return max(0, pace.remaining) * (pace.steps + 1) / (pace.produced + 1)


def bottleneck_weights(
    paces: Sequence[RowPace], slack: float = SLACK, others: float = OTHERS, scale: bool = SCALE
) -> list[float]:
    """Each row's weight in the pass (see the module doc): 1 for the rows whose projected steps
    are within ``slack`` of the longest and for rows drafting from a prediction, ``others`` for
    the rest; all 1 with fewer than two rows or when a row's remaining tokens are unknown.

    >>> bottleneck_weights([RowPace(90), RowPace(40, produced=20, steps=10)])
    [1.0, 0.0]
    """
    if len(paces) < 2 or any(p.remaining is None for p in paces):
        return [1.0] * len(paces)
    steps = [projected_steps(p) for p in paces]
    longest = max(steps)
    bottleneck = [s >= longest - slack for s in steps]
    weight = len(paces) / sum(bottleneck) if scale else 1.0
    return [
        1.0 if p.predicted else weight if slowest else float(others)
        for p, s, slowest in zip(paces, steps, bottleneck)
    ]
