"""Acceptance statistics: how often draft token j was accepted given tokens 1..j-1 were
(:class:`AcceptanceModel`), counted per *bucket* (how the draft was found: the length of the
match, and its source; :func:`match_bucket`) and per position (:func:`position_bucket`), with
the prior they start from (:func:`prior_acceptance`). The speculation policy
(:mod:`promptlookup.policy`) weighs a sequence's own counts with its tenant's history and this
prior; vLLM's proposer keeps a request's counts in one too."""

from __future__ import annotations

from collections import defaultdict


def match_bucket(match_length: int | None, source: str | None = None) -> int | tuple[str, int]:
    """Group match lengths: None (no match info) -> 0, 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-31, 32+.
    A draft from another ``source`` than the request's own context gets its own buckets,
    ``(source, bucket)``.

    >>> match_bucket(6), match_bucket(6, source="shared")
    (5, ('shared', 5))
    """
    bucket = 0
    if match_length:
        bucket = 9
        for number, upper in enumerate((1, 2, 3, 5, 7, 11, 15, 31), start=1):
            if match_length <= upper:
                bucket = number
                break
    return bucket if source is None else (source, bucket)


def position_bucket(position: int) -> int:
    """Group draft positions (1-based): 1, 2, 3, 4, 5-6, 7-8, 9-12, 13-16, 17-24, 25-32, 33+."""
    for bucket, upper in enumerate((1, 2, 3, 4, 6, 8, 12, 16, 24, 32)):
        if position <= upper:
            return bucket
    return 10


class AcceptanceModel:
    """Counts of how often draft token j was accepted given tokens 1..j-1 were, per bucket."""

    def __init__(self) -> None:
        self.reached: dict[tuple[int, int], float] = defaultdict(float)
        self.accepted: dict[tuple[int, int], float] = defaultdict(float)

    def record(self, bucket: int, num_drafted: int, num_accepted: int) -> None:
        for position in range(1, min(num_drafted, num_accepted + 1) + 1):
            key = (bucket, position_bucket(position))
            self.reached[key] += 1
            self.accepted[key] += position <= num_accepted

    def evidence(self, bucket: int, position: int) -> float:
        return self.reached.get((bucket, position_bucket(position)), 0.0)

    def rate(self, bucket: int, position: int, prior_rate: float, prior_weight: float) -> float:
        key = (bucket, position_bucket(position))
        return (self.accepted.get(key, 0.0) + prior_weight * prior_rate) / (
            self.reached.get(key, 0.0) + prior_weight
        )


def prior_acceptance(bucket: int | tuple[str, int]) -> float:
    """Before any evidence: trust a draft token more the longer the match that found it (the
    same prior for every source)."""
    length_bucket = bucket[1] if isinstance(bucket, tuple) else bucket
    return (0.35, 0.3, 0.45, 0.55, 0.62, 0.7, 0.76, 0.82, 0.87, 0.92)[length_bucket]
