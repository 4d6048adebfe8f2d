"""Cost-aware speculation: how many draft tokens are worth verifying at each step.

A forward pass over ``n`` tokens costs ``cost(n)`` seconds — measured on the actual hardware,
model and dtype (a quick calibration on first use, then refined with every forward pass). A draft
of ``k`` tokens is accepted token by token with probabilities learned online from how earlier
drafts fared, keyed by how the drafter found it (for prompt lookup: the length of the suffix
match, longer matches being accepted more often; and the draft's source, when a drafter has
several: drafts from a cross-request index keep statistics of their own). A step that
verifies ``k`` draft tokens yields
on average ``1 + E[accepted | k]`` tokens, so the policy picks

    k* = argmax_k (1 + E[accepted | k]) / cost(k + 1),    k = 0 .. len(draft)

and ``k* = 0`` (a plain decoding step) whenever drafting does not pay. Where wide passes are
dear (llama.cpp on a CPU: a pass over 2 tokens costs far more than over one), that means
drafting only on long, trusted matches; where 8 tokens cost about one (the transformers target,
on CPUs and GPUs), it means drafting long drafts freely.

    E[accepted | k] = sum_{i=1..k} prod_{j=1..i} a(bucket, j)

where ``a(bucket, j)`` is the probability that draft token j is accepted given tokens 1..j-1
were: a Beta-smoothed ratio of counts, mixing this request's counts with those of all earlier
requests (which themselves start from a prior that trusts longer matches more). Greedy and
sampled decoding keep separate statistics.

The cost curves themselves (one per context length, their files and calibration) are kept by a
:class:`~promptlookup.cost_store.CostStore`; this module holds the decision rule and the
acceptance statistics.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cost_model import CostModel
from .cost_store import CostStore
from .drafters.base import Draft
from .errors import InvalidParameterError

__all__ = [
    "MAX_DRAFT",
    "AcceptanceModel",
    "SequenceDraft",
    "SpeculationPolicy",
    "check_speculation",
    "match_bucket",
    "position_bucket",
    "prior_acceptance",
]

#: Longest draft the adaptive policy will ever verify.
MAX_DRAFT = 63


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


@dataclass(frozen=True)
class SequenceDraft:
    """One sequence's part in a decision (:meth:`SpeculationPolicy.joint_draft_lengths`): its
    draft's length, match length and source (see :meth:`SpeculationPolicy.draft_length`), its
    own acceptance statistics and whether it samples."""

    length: int
    match_length: int | None
    acceptance: AcceptanceModel
    sampling: bool
    source: str | None = None


def check_speculation(speculation: str) -> str:
    """``"adaptive"`` (this policy decides) or ``"fixed"`` (whole drafts are verified)."""
    if speculation not in ("adaptive", "fixed"):
        raise InvalidParameterError(
            f"speculation must be 'adaptive' or 'fixed', got {speculation!r}"
        )
    return speculation


class SpeculationPolicy:
    """Chooses each step's draft length from measured costs and learned acceptance.

    One policy lives with a loaded model (its costs and statistics carry over between
    requests); :meth:`start` begins a request's own statistics.
    """

    def __init__(
        self,
        global_weight: float = 4.0,
        prior_weight: float = 3.0,
        exploration: float = 0.5,
        cost_file: str | os.PathLike | None = None,
    ) -> None:
        self.exploration = exploration
        #: The measured cost curves, one per context length (kept in ``cost_file``).
        self.store = CostStore(cost_file)
        self.history = {False: AcceptanceModel(), True: AcceptanceModel()}  # by sampling
        #: The current request's own acceptance statistics (:meth:`start`), whether it samples.
        self.request_acceptance = AcceptanceModel()
        self.sampling = False
        self.global_weight = global_weight
        self.prior_weight = prior_weight
        #: Cost curves of passes over several sequences, by batch size (:meth:`batch_costs`).
        self.batch_curves: dict[int, CostModel] = {}

    def start(self, target, probe_token: int, sampling: bool) -> None:
        """Begin a request (after the prompt's prefill): its own acceptance statistics, and the
        cost curve of its context length (see :meth:`CostStore.begin`, which may time forward
        passes of ``probe_token`` on ``target``)."""
        self.request_acceptance = AcceptanceModel()
        self.sampling = sampling
        self.store.begin(target, probe_token)

    @property
    def costs(self) -> CostModel:
        """The cost curve of the current request's context length."""
        return self.store.current

    @property
    def cost_file(self) -> Path | None:
        """Where the cost curves are kept between runs (None: in memory only)."""
        return self.store.cost_file

    @cost_file.setter
    def cost_file(self, path: str | os.PathLike | None) -> None:
        self.store.cost_file = Path(path) if path else None

    def acceptance(
        self,
        bucket: int,
        position: int,
        statistics: AcceptanceModel | None = None,
        sampling: bool | None = None,
    ) -> float:
        """Estimated probability that draft token ``position`` is accepted given the ones
        before were, plus an exploration bonus that shrinks as evidence accumulates (so a
        pessimistic start cannot keep the policy from ever trying, and learning).
        ``statistics``/``sampling``: whose (default: the current request's)."""
        own = self.request_acceptance if statistics is None else statistics
        sampling = self.sampling if sampling is None else sampling
        prior = prior_acceptance(bucket)
        history = self.history[sampling]
        rate = history.rate(bucket, position, prior, self.prior_weight)
        rate = own.rate(bucket, position, rate, self.global_weight)
        evidence = history.evidence(bucket, position) + own.evidence(bucket, position)
        bonus = self.exploration * math.sqrt(rate * (1 - rate) / (evidence + 1))
        return min(rate + bonus, 0.999)

    def draft_length(self, draft: Sequence[int], match_length: int | None) -> int:
        """How many leading tokens of ``draft`` to verify (0 = a plain step): the rule of
        :meth:`joint_draft_lengths` for the current request alone, by the statistics of its
        match length and of its ``source`` (a :class:`~promptlookup.drafters.base.Draft`'s; a
        plain list: the request's own),

            k* = argmax_k (1 + E[accepted | k]) / cost(k + 1)."""
        if not draft:
            return 0
        entry = self._current(len(draft), match_length, getattr(draft, "source", None))
        return self.joint_draft_lengths([entry])[0]

    def shape(self, draft: Draft) -> Draft:
        """The part of ``draft`` worth verifying for the current request: its first
        :meth:`draft_length` tokens."""
        return draft.cut(self.draft_length(draft, draft.match_length))

    def expected_accepted(
        self, length: int, match_length: int | None, source: str | None = None
    ) -> float:
        """``E[accepted | k]`` for a draft of ``length`` tokens found by a match of
        ``match_length`` in ``source`` (the current request's statistics): how a drafter with
        several sources compares their drafts."""
        return sum(self._gains(self._current(length, match_length, source)))

    def worth_drafting(self, seconds_per_draft_token: float, limit: int = MAX_DRAFT) -> int:
        """How many tokens a drafter that pays for each (a draft model: one forward pass of
        its own per token) should produce, for drafts without match information: the rule of
        :meth:`joint_draft_lengths` with each draft token's price added,

            argmax_k (1 + E[accepted | k]) / (cost(k + 1) + k * seconds_per_draft_token)

        0 when even one draft token does not pay for itself and its verification."""
        entry = self._current(limit, None, None)
        return self.joint_draft_lengths([entry], draft_seconds=seconds_per_draft_token)[0]

    def _current(self, length: int, match_length: int | None, source: str | None) -> SequenceDraft:
        """A draft of the current request (:meth:`start`), as the rule takes it."""
        return SequenceDraft(length, match_length, self.request_acceptance, self.sampling, source)

    def _gains(self, entry: SequenceDraft) -> Iterator[float]:
        """What each of the draft's tokens adds to the expected accepted tokens, in order:
        ``prod_{l<=j} a(l)`` for token j, until it falls under 1e-3."""
        bucket, survive = match_bucket(entry.match_length, entry.source), 1.0
        for position in range(1, min(entry.length, MAX_DRAFT) + 1):
            survive *= self.acceptance(bucket, position, entry.acceptance, entry.sampling)
            if survive < 1e-3:
                return
            yield survive

    def joint_draft_lengths(
        self,
        drafts: Sequence[SequenceDraft],
        fixed_tokens: int = 0,
        draft_seconds: float = 0.0,
        weights: Sequence[float] | None = None,
    ) -> list[int]:
        """The decision rule: how many leading tokens of each sequence's draft to verify in one
        forward pass over all of them, which also carries ``fixed_tokens`` rows nobody decides
        (prompt chunks, whole drafts of ``speculation="fixed"`` sequences):

            argmax over (k_1 .. k_B) of (B + sum_i E_i[accepted | k_i])
                / (cost(fixed + B + sum_i k_i) + draft_seconds * sum_i k_i)

        with ``cost`` the curve of passes over ``B`` sequences (:meth:`batch_costs`) and
        ``draft_seconds`` the price of producing a draft token (0 but for a draft model). Draft
        token j of sequence i adds ``prod_{l<=j} a_i(l)`` expected tokens, which falls with
        j, so for every total the best choice takes the largest of these gains over all
        sequences: the gains are merged, largest first, and the best prefix is kept.

        Example: two sequences, one on a long trusted match (gains 0.9, 0.8, 0.7), one with no
        match (gain 0.2): with 4 tokens costing about as much as 3, the first gets all three
        draft tokens and the second none if ``cost(2 + 4)`` outweighs 0.2 more tokens.

        ``weights`` (optional, one per sequence): each sequence's gains multiplied by its
        weight, 0 leaving it no draft (how much its tokens are worth to the caller; vLLM's
        bottleneck rule, :mod:`promptlookup.vllm.batch_policy`).
        """
        costs = self.batch_costs(len(drafts))
        weights = [1.0] * len(drafts) if weights is None else weights
        gains = [
            (gain * weight, index)
            for index, (entry, weight) in enumerate(zip(drafts, weights)) if weight > 0
            for gain in self._gains(entry)
        ]  # fmt: skip
        gains.sort(key=lambda gain: -gain[0])  # stable: each draft's own gains stay in order
        base = fixed_tokens + len(drafts)
        expected, best_count, best_rate = float(len(drafts)), 0, len(drafts) / costs.cost(base)
        # Grow the pass by the next largest gain; keep the count with the best rate.
        for count, (gain, _) in enumerate(gains, start=1):
            expected += gain
            rate = expected / (costs.cost(base + count) + draft_seconds * count)
            if rate > best_rate:
                best_count, best_rate = count, rate
        lengths = [0] * len(drafts)
        for _, index in gains[:best_count]:
            lengths[index] += 1
        return lengths

    def batch_costs(self, batch_size: int) -> CostModel:
        """The cost curve of forward passes over ``batch_size`` sequences, by the total tokens
        in the pass (one sequence: the current request's curve). A new batch size starts from
        the one-sequence curve and learns its own from its passes (kept in memory only)."""
        if batch_size <= 1:
            return self.costs
        curve = self.batch_curves.get(batch_size)
        if curve is None:
            curve = self.batch_curves[batch_size] = CostModel()
            if self.costs.calibrated:
                curve.seed(self.costs)
        return curve

    def record_forward(self, num_tokens: int, seconds: float, batch_size: int = 1) -> None:
        self.batch_costs(batch_size).record(num_tokens, seconds)

    def record_acceptance(
        self,
        match_length: int | None,
        num_drafted: int,
        num_accepted: int,
        statistics: AcceptanceModel | None = None,
        sampling: bool | None = None,
        source: str | None = None,
    ) -> None:
        """Note how a draft fared, in ``statistics`` (default: the current request's) and in
        the history of requests that sample, or not, as ``sampling`` (default: the current)."""
        bucket = match_bucket(match_length, source)
        own = self.request_acceptance if statistics is None else statistics
        own.record(bucket, num_drafted, num_accepted)
        sampling = self.sampling if sampling is None else sampling
        self.history[sampling].record(bucket, num_drafted, num_accepted)

    def __repr__(self) -> str:
        curve = ", ".join(f"{n}:{self.costs.cost(n) * 1e3:.1f}ms" for n in self.costs.sizes)
        return f"SpeculationPolicy(costs=[{curve}])"
