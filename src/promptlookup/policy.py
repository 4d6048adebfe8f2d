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
drafting only on long, trusted matches; where 8 tokens cost about one (the torch target,
on CPUs and GPUs), it means drafting long drafts freely.

    E[accepted | k] = sum_{i=1..k} prod_{j=1..i} a(bucket, j)

where ``a(bucket, j)`` is the probability that draft token j is accepted given tokens 1..j-1
were: a Beta-smoothed ratio of counts, mixing this request's counts with those of all earlier
requests (which themselves start from a prior that trusts longer matches more). Greedy and
sampled decoding keep separate statistics.

The policy only decides (:meth:`SpeculationPolicy.decide`, its one entry point) and learns
what its requests tell it. The cost curves (one per context length and batch size, their
files) are kept by a :class:`~promptlookup.cost_store.CostStore`; the passes that calibrate
them are timed by whatever prepares the target (:mod:`promptlookup.calibration`). Each
sequence's own acceptance statistics live with the sequence (:class:`Speculation`), not here;
how they are counted, bucketed and started is :mod:`promptlookup.acceptance`.
"No policy" (``speculation="fixed"``: every draft verified whole) is :data:`NO_POLICY`, which
answers the same calls.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .acceptance import AcceptanceModel, match_bucket, position_bucket, prior_acceptance
from .cost_store import CostStore
from .drafters.base import Draft
from .errors import InvalidParameterError
from .limits import MAX_TENANTS

__all__ = [
    "MAX_DRAFT",
    "NO_POLICY",
    "AcceptanceModel",
    "NoPolicy",
    "SequenceDraft",
    "Speculation",
    "SpeculationPolicy",
    "match_bucket",
    "policy_for_speculation",
    "position_bucket",
    "prior_acceptance",
]

#: Longest draft the adaptive policy will ever verify.
MAX_DRAFT = 63


@dataclass(frozen=True)
class SequenceDraft:
    """One sequence's part in a decision (:meth:`SpeculationPolicy.decide`): its draft's
    length, the match length and source that found it (see :func:`match_bucket`), the
    sequence's own acceptance statistics, whether it samples, and the tokens in its cache
    when it started (which cost curve prices a pass of it alone)."""

    length: int
    match_length: int | None
    acceptance: AcceptanceModel
    sampling: bool
    source: str | None = None
    context: int = 0
    #: Whose requests' history it is weighed with (an opaque key, e.g. a server's API key).
    tenant: str | None = None


class SpeculationPolicy:
    """Chooses each step's draft lengths from measured costs and learned acceptance.

    One policy lives with a loaded model: its cost curves (``cost_file``: where they are kept
    between runs) and the acceptance history of its requests carry over between requests. The
    history is kept per tenant (:attr:`SequenceDraft.tenant`), so that one tenant's drafts are
    never sized by what another's were accepted at (which would reveal that traffic, though
    not its content); the cost curves, facts of the machine, are shared.
    """

    def __init__(
        self,
        global_weight: float = 4.0,
        prior_weight: float = 3.0,
        exploration: float = 0.5,
        cost_file: str | os.PathLike | None = None,
    ) -> None:
        self.exploration = exploration
        self.global_weight = global_weight
        self.prior_weight = prior_weight
        self._costs = CostStore(cost_file)
        #: Acceptance history by tenant (the most recently used last), then by sampling.
        self._histories: OrderedDict[str | None, dict[bool, AcceptanceModel]] = OrderedDict()

    @property
    def cost_file(self) -> Path | None:
        """Where the cost curves are kept between runs (None: in memory only)."""
        return self._costs.cost_file

    @cost_file.setter
    def cost_file(self, path: str | os.PathLike | None) -> None:
        self._costs.cost_file = Path(path) if path else None

    @property
    def calibrated(self) -> bool:
        """Whether a cost curve was measured (or read from ``cost_file``)."""
        return not self._costs.calibration_plan(0)[0]

    def decide(
        self,
        drafts: Sequence[SequenceDraft],
        fixed_tokens: int = 0,
        draft_seconds: float = 0.0,
        weights: Sequence[float] | None = None,
    ) -> list[int]:
        """The decision rule: how many leading tokens of each sequence's draft to verify in one
        forward pass over all of them, which also carries ``fixed_tokens`` rows nobody decides
        (prompt chunks, whole drafts of sequences without a policy):

            argmax over (k_1 .. k_B) of (B + sum_i E_i[accepted | k_i])
                / (cost(fixed + B + sum_i k_i) + draft_seconds * sum_i k_i)

        with ``cost`` the curve of passes over ``B`` sequences (one sequence: the curve of its
        context length) and ``draft_seconds`` the price of producing a draft token (0 but for
        a draft model). Draft token j of sequence i adds ``prod_{l<=j} a_i(l)`` expected
        tokens, which falls with j, so for every total the best choice takes the largest of
        these gains over all sequences: the gains are merged, largest first, and the best
        prefix is kept.

        Example: two sequences, one on a long trusted match (gains 0.9, 0.8, 0.7), one with no
        match (gain 0.2): with 4 tokens costing about as much as 3, the first gets all three
        draft tokens and the second none if ``cost(2 + 4)`` outweighs 0.2 more tokens.

        ``weights`` (optional, one per sequence): each sequence's gains multiplied by its
        weight, 0 leaving it no draft (how much its tokens are worth to the caller; vLLM's
        bottleneck rule, :mod:`promptlookup.vllm.batch_policy`).
        """
        context = max((draft.context for draft in drafts), default=0)
        costs = self._costs.curve(context, len(drafts))
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

    def expected_accepted(self, draft: SequenceDraft) -> float:
        """``E[accepted | k]`` for ``draft`` (its ``length`` tokens): how a drafter with
        several sources compares their drafts."""
        return sum(self._gains(draft))

    def learn(self, draft: SequenceDraft, num_accepted: int) -> None:
        """Note that the first ``num_accepted`` of ``draft``'s tokens were accepted, in its
        sequence's own statistics and in the history of requests that sample, or not, as it
        does."""
        bucket = match_bucket(draft.match_length, draft.source)
        draft.acceptance.record(bucket, draft.length, num_accepted)
        self._history(draft).record(bucket, draft.length, num_accepted)

    def record_forward(
        self, num_tokens: int, seconds: float, context: int = 0, batch_size: int = 1
    ) -> None:
        """Note a forward pass over ``num_tokens`` tokens of ``batch_size`` sequences, after
        ``context`` cached tokens (one sequence), that took ``seconds``."""
        self._costs.record(num_tokens, seconds, context, batch_size)

    def calibration_plan(self, context: int) -> tuple[tuple[int, ...], int]:
        """Pass sizes to time before a request after ``context`` cached tokens, and how many
        rounds (none once costs are measured; :mod:`promptlookup.calibration` times them)."""
        return self._costs.calibration_plan(context)

    def record_calibration(self, context: int, timings: Iterable[tuple[int, float, float]]) -> None:
        """The timed passes of :func:`promptlookup.calibration.time_passes`."""
        self._costs.record_calibration(context, timings)

    def _acceptance(self, bucket, position: int, draft: SequenceDraft) -> float:
        """Estimated probability that draft token ``position`` is accepted given the ones
        before were (the sequence's statistics over the history's over the prior), plus an
        exploration bonus that shrinks as evidence accumulates (so a pessimistic start cannot
        keep the policy from ever trying, and learning)."""
        own, history = draft.acceptance, self._history(draft)
        rate = history.rate(bucket, position, prior_acceptance(bucket), self.prior_weight)
        rate = own.rate(bucket, position, rate, self.global_weight)
        evidence = history.evidence(bucket, position) + own.evidence(bucket, position)
        bonus = self.exploration * math.sqrt(rate * (1 - rate) / (evidence + 1))
        return min(rate + bonus, 0.999)

    def _history(self, draft: SequenceDraft) -> AcceptanceModel:
        """The acceptance history of ``draft``'s tenant, of requests that sample or not as it
        does (a tenant's first request starts one; beyond
        :data:`~promptlookup.limits.MAX_TENANTS` the least recently used is forgotten)."""
        histories = self._histories.pop(draft.tenant, None)
        if histories is None:
            histories = {False: AcceptanceModel(), True: AcceptanceModel()}
        self._histories[draft.tenant] = histories
        while len(self._histories) > MAX_TENANTS:
            self._histories.popitem(last=False)
        return histories[draft.sampling]

    def _gains(self, draft: SequenceDraft) -> Iterator[float]:
        """What each of the draft's tokens adds to the expected accepted tokens, in order:
        ``prod_{l<=j} a(l)`` for token j, until it falls under 1e-3."""
        bucket, survive = match_bucket(draft.match_length, draft.source), 1.0
        for position in range(1, min(draft.length, MAX_DRAFT) + 1):
            survive *= self._acceptance(bucket, position, draft)
            if survive < 1e-3:
                return
            yield survive

    def __repr__(self) -> str:
        costs = self._costs.curve()
        curve = ", ".join(f"{n}:{costs.cost(n) * 1e3:.1f}ms" for n in costs.sizes)
        return f"SpeculationPolicy(costs=[{curve}])"


class NoPolicy:
    """No policy (``speculation="fixed"``): every draft is verified whole; nothing is timed or
    learned. It answers :class:`SpeculationPolicy`'s calls, so callers never ask whether there
    is a policy."""

    cost_file = None

    def decide(self, drafts, fixed_tokens=0, draft_seconds=0.0, weights=None) -> list[int]:
        return [draft.length for draft in drafts]

    def expected_accepted(self, draft: SequenceDraft) -> float:
        return float(draft.length)  # no statistics: the longer draft

    def learn(self, draft: SequenceDraft, num_accepted: int) -> None:
        pass

    def record_forward(self, num_tokens, seconds, context=0, batch_size=1) -> None:
        pass

    def calibration_plan(self, context: int) -> tuple[tuple[int, ...], int]:
        return (), 0

    def record_calibration(self, context, timings) -> None:
        pass

    def __repr__(self) -> str:
        return "NO_POLICY"


#: The one null policy.
NO_POLICY = NoPolicy()


#: The values of ``speculation=`` (``generate``, ``--speculation``): the policy, or none.
SPECULATION_MODES = ("adaptive", "fixed")


def policy_for_speculation(
    speculation: str, adaptive: SpeculationPolicy
) -> SpeculationPolicy | NoPolicy:
    """``"adaptive"``: ``adaptive`` decides; ``"fixed"``: :data:`NO_POLICY` (whole drafts)."""
    if speculation not in SPECULATION_MODES:
        raise InvalidParameterError(
            f"speculation must be 'adaptive' or 'fixed', got {speculation!r}"
        )
    return adaptive if speculation == "adaptive" else NO_POLICY


@dataclass(eq=False)
class Speculation:
    """One sequence's side of a policy: the sequence's own acceptance statistics (requests
    keep theirs here, not in the shared policy), whether it samples, its context length when
    it started and its tenant (whose history the policy weighs it with). Its drafters consult the policy through it (a drafter's ``policy``,
    :func:`~promptlookup.drafters.base.bind_generation`)."""

    policy: SpeculationPolicy | NoPolicy
    sampling: bool = False
    context: int = 0
    tenant: str | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)

    def entry(self, length: int, match_length: int | None = None, source=None) -> SequenceDraft:
        """A draft of this sequence, as :meth:`SpeculationPolicy.decide` takes it."""
        return SequenceDraft(
            length, match_length, self.acceptance, self.sampling, source, self.context, self.tenant
        )

    def of(self, draft: Draft) -> SequenceDraft:
        """:meth:`entry` for a :class:`~promptlookup.drafters.base.Draft`."""
        return self.entry(len(draft), draft.match_length, draft.source)

    def shape(self, draft: Draft) -> Draft:
        """The part of ``draft`` worth verifying for this sequence alone."""
        return draft.cut(self.policy.decide([self.of(draft)])[0]) if draft else draft

    def learn(self, draft: Draft, num_accepted: int) -> None:
        """Tell the policy how ``draft`` fared (nothing for an empty draft)."""
        if draft:
            self.policy.learn(self.of(draft), num_accepted)

    def expected_accepted(
        self, length: int, match_length: int | None, source: str | None = None
    ) -> float:
        """``E[accepted | k]`` of a draft of ``length`` tokens found by a match of
        ``match_length`` in ``source``, by this sequence's statistics."""
        return self.policy.expected_accepted(self.entry(length, match_length, source))

    def worth_drafting(self, seconds_per_draft_token: float, limit: int = MAX_DRAFT) -> int:
        """How many tokens a drafter that pays for each (a draft model: one forward pass of
        its own per token) should produce, for drafts without match information: the rule of
        :meth:`SpeculationPolicy.decide` with each draft token's price added,

            argmax_k (1 + E[accepted | k]) / (cost(k + 1) + k * seconds_per_draft_token)

        0 when even one draft token does not pay for itself and its verification."""
        return self.policy.decide([self.entry(limit)], draft_seconds=seconds_per_draft_token)[0]
