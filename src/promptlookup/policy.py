"""Cost-aware speculation: how many draft tokens are worth verifying at each step.

A forward pass over ``n`` tokens costs ``cost(n)`` seconds — measured on the actual hardware,
model and dtype (a quick calibration on first use, then refined with every forward pass). A draft
of ``k`` tokens is accepted token by token with probabilities learned online from how earlier
drafts fared, keyed by how the drafter found it (for prompt lookup: the length of the suffix
match; longer matches are accepted more often). A step that verifies ``k`` draft tokens yields
on average ``1 + E[accepted | k]`` tokens, so the policy picks

    k* = argmax_k (1 + E[accepted | k]) / cost(k + 1),    k = 0 .. len(draft)

and ``k* = 0`` (a plain decoding step) whenever drafting does not pay. Where wide passes are
dear (llama.cpp on this project's CPUs: 2 tokens cost 1.7x one), that means drafting only on
long, trusted matches; where 8 tokens cost about one (the transformers target on CPU, GPUs), it
means drafting long drafts freely.

    E[accepted | k] = sum_{i=1..k} prod_{j=1..i} a(bucket, j)

where ``a(bucket, j)`` is the probability that draft token j is accepted given tokens 1..j-1
were: a Beta-smoothed ratio of counts, mixing this request's counts with those of all earlier
requests (which themselves start from a prior that trusts longer matches more). Greedy and
sampled decoding keep separate statistics.

The cost curve is kept per context length (up to 1,024 tokens, then one per doubling): with a
long cache, attention makes a pass over many tokens relatively dearer than over one, so a curve
measured after a short prompt would make drafts after a long one look cheaper than they are.
A context length's curve starts as a copy of the nearest one measured (one sample per size, so
its own passes soon outweigh the copy) rather than being timed inside the first long request;
only a process whose policy has measured nothing yet calibrates there.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from .cost_model import QUICK_CALIBRATION_SIZES, CostModel
from .errors import InvalidParameterError

#: Longest draft the adaptive policy will ever verify.
MAX_DRAFT = 63
#: Context buckets are 0 .. LAST_CONTEXT_BUCKET (see :func:`context_bucket`).
LAST_CONTEXT_BUCKET = 5


def match_bucket(match_length: int | None) -> int:
    """Group match lengths: None (no match info) -> 0, 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-31, 32+."""
    if not match_length:
        return 0
    for bucket, upper in enumerate((1, 2, 3, 5, 7, 11, 15, 31), start=1):
        if match_length <= upper:
            return bucket
    return 9


def context_bucket(context_length: int) -> int:
    """Group cache lengths, whose attention makes long passes dearer: up to 1,024 tokens -> 0,
    then one bucket per doubling (2,048 -> 1, 4,096 -> 2, ...), beyond 16,384 -> 5."""
    return min(max(0, (max(context_length, 1) - 1).bit_length() - 10), LAST_CONTEXT_BUCKET)


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
        return ((self.accepted.get(key, 0.0) + prior_weight * prior_rate)
                / (self.reached.get(key, 0.0) + prior_weight))


def prior_acceptance(bucket: int) -> float:
    """Before any evidence: trust a draft token more the longer the match that found it."""
    return (0.35, 0.3, 0.45, 0.55, 0.62, 0.7, 0.76, 0.82, 0.87, 0.92)[bucket]


def check_speculation(speculation: str) -> str:
    """``"adaptive"`` (this policy decides) or ``"fixed"`` (whole drafts are verified)."""
    if speculation not in ("adaptive", "fixed"):
        raise InvalidParameterError(f"speculation must be 'adaptive' or 'fixed', got {speculation!r}")
    return speculation


class SpeculationPolicy:
    """Chooses each step's draft length from measured costs and learned acceptance.

    One policy lives with a loaded model (its costs and statistics carry over between
    requests); :meth:`start` begins a request's own statistics.
    """

    def __init__(self, global_weight: float = 4.0, prior_weight: float = 3.0,
                 exploration: float = 0.5, cost_file: str | os.PathLike | None = None) -> None:
        self.exploration = exploration
        #: One measured cost curve per context bucket (see :func:`context_bucket`): attention
        #: over a long cache makes passes over many tokens relatively dearer.
        self.cost_models: dict[int, CostModel] = {}
        self.context = 0  # the current request's context bucket
        self.costs = self.cost_models.setdefault(0, CostModel())
        self.cost_file = Path(cost_file) if cost_file else None
        self._loaded: set[int] = set()  # context buckets whose cost file was read
        self.history = {False: AcceptanceModel(), True: AcceptanceModel()}  # by sampling
        self.request: AcceptanceModel = AcceptanceModel()
        self.sampling = False
        self.global_weight = global_weight
        self.prior_weight = prior_weight

    def start(self, target, probe_token: int, sampling: bool) -> None:
        """Begin a request (after the prompt's prefill): pick the cost curve of its context
        length; a length without one starts from the nearest measured curve, and only a policy
        that has measured none calibrates (inside this request)."""
        self.request = AcceptanceModel()
        self.sampling = sampling
        if self.costs.calibrated:
            self._save()  # keep what the last request refined
        self.context = context_bucket(target.cache_length)
        self.costs = self._stored_curve(self.context)
        if not self.costs.calibrated:
            measured = [bucket for bucket in range(LAST_CONTEXT_BUCKET + 1)
                         if bucket != self.context and self._stored_curve(bucket).calibrated]
            nearest = min(measured, key=lambda bucket: abs(bucket - self.context), default=None)
            if nearest is not None:  # refined by this request's own passes
                self.costs.seed(self.cost_models[nearest])
            elif self.context == 0:
                self.costs.calibrate(target, probe_token)
            else:  # passes after a long cache are slow: a quick curve, refined online
                self.costs.calibrate(target, probe_token, sizes=QUICK_CALIBRATION_SIZES, repeats=1)
            self._save()

    def _stored_curve(self, bucket: int) -> CostModel:
        """Context ``bucket``'s curve, loaded from its file on first use (uncalibrated if
        there is none)."""
        costs = self.cost_models.get(bucket) or CostModel()
        if not costs.calibrated and bucket not in self._loaded and self._cost_path(bucket):
            self._loaded.add(bucket)
            costs.load(self._cost_path(bucket))
        if costs.calibrated or bucket == self.context:  # else nothing measured for that length
            self.cost_models[bucket] = costs
        return costs

    def _cost_path(self, bucket: int | None = None) -> Path | None:
        """The cost file of context ``bucket`` (default: the current one; bucket 0 uses
        ``cost_file`` itself)."""
        bucket = self.context if bucket is None else bucket
        if self.cost_file is None or bucket == 0:
            return self.cost_file
        return self.cost_file.with_name(f"{self.cost_file.stem}-context{bucket}.json")

    def _save(self) -> None:
        if self._cost_path() is not None:
            self.costs.save(self._cost_path())

    def acceptance(self, bucket: int, position: int) -> float:
        """Estimated probability that draft token ``position`` is accepted given the ones
        before were, plus an exploration bonus that shrinks as evidence accumulates (so a
        pessimistic start cannot keep the policy from ever trying, and learning)."""
        prior = prior_acceptance(bucket)
        history = self.history[self.sampling]
        rate = history.rate(bucket, position, prior, self.prior_weight)
        rate = self.request.rate(bucket, position, rate, self.global_weight)
        evidence = history.evidence(bucket, position) + self.request.evidence(bucket, position)
        bonus = self.exploration * math.sqrt(rate * (1 - rate) / (evidence + 1))
        return min(rate + bonus, 0.999)

    def draft_length(self, draft: Sequence[int], match_length: int | None) -> int:
        """How many leading tokens of ``draft`` to verify (0 = a plain step)."""
        if not draft:
            return 0
        return self._best_length(match_bucket(match_length), min(len(draft), MAX_DRAFT))

    def worth_drafting(self, seconds_per_draft_token: float, limit: int = MAX_DRAFT) -> int:
        """How many tokens a drafter that pays for each (a draft model: one forward pass of
        its own per token) should produce, for drafts without match information:

            argmax_k (1 + E[accepted | k]) / (cost(k + 1) + k * seconds_per_draft_token)

        0 when even one draft token does not pay for itself and its verification."""
        return self._best_length(match_bucket(None), min(limit, MAX_DRAFT), seconds_per_draft_token)

    def _best_length(self, bucket: int, max_k: int, draft_seconds: float = 0.0) -> int:
        """argmax over k in 0..max_k of expected tokens per second of a step verifying k."""
        best_k, best_rate = 0, 1.0 / self.costs.cost(1)
        expected, survive = 1.0, 1.0
        for k in range(1, max_k + 1):
            survive *= self.acceptance(bucket, k)
            expected += survive
            rate = expected / (self.costs.cost(k + 1) + k * draft_seconds)
            if rate > best_rate:
                best_k, best_rate = k, rate
            if survive < 1e-3:
                break
        return best_k

    def record_forward(self, num_tokens: int, seconds: float) -> None:
        self.costs.record(num_tokens, seconds)

    def record_acceptance(self, match_length: int | None, num_drafted: int, num_accepted: int) -> None:
        bucket = match_bucket(match_length)
        self.request.record(bucket, num_drafted, num_accepted)
        self.history[self.sampling].record(bucket, num_drafted, num_accepted)

    def __repr__(self) -> str:
        curve = ", ".join(f"{n}:{self.costs.cost(n) * 1e3:.1f}ms" for n in self.costs.sizes)
        return f"SpeculationPolicy(costs=[{curve}])"
