"""Cost-aware speculation: how many draft tokens are worth verifying at each step.

A forward pass over ``n`` tokens costs ``cost(n)`` seconds — measured on the actual hardware,
model and dtype (a quick calibration on first use, then refined with every forward pass). A draft
of ``k`` tokens is accepted token by token with probabilities learned online from how earlier
drafts fared, keyed by how the drafter found it (for prompt lookup: the length of the suffix
match; longer matches are accepted more often). A step that verifies ``k`` draft tokens yields
on average ``1 + E[accepted | k]`` tokens, so the policy picks

    k* = argmax_k (1 + E[accepted | k]) / cost(k + 1),    k = 0 .. len(draft)

and ``k* = 0`` (a plain decoding step) whenever drafting does not pay. With float32 on a CPU,
where two tokens cost about twice one, that means drafting only on long, trusted matches; with
bfloat16 or a GPU, where 8 tokens cost about one, it means drafting long drafts freely.

    E[accepted | k] = sum_{i=1..k} prod_{j=1..i} a(bucket, j)

where ``a(bucket, j)`` is the probability that draft token j is accepted given tokens 1..j-1
were: a Beta-smoothed ratio of counts, mixing this request's counts with those of all earlier
requests (which themselves start from a prior that trusts longer matches more). Greedy and
sampled decoding keep separate statistics.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Sequence

#: Draft lengths + 1 at which the cost curve is calibrated (others are interpolated).
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Longest draft the adaptive policy will ever verify.
MAX_DRAFT = 63


def match_bucket(match_length: int | None) -> int:
    """Group match lengths: None (no match info) -> 0, 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-31, 32+."""
    if not match_length:
        return 0
    for bucket, upper in enumerate((1, 2, 3, 5, 7, 11, 15, 31), start=1):
        if match_length <= upper:
            return bucket
    return 9


def position_bucket(position: int) -> int:
    """Group draft positions (1-based): 1, 2, 3, 4, 5-6, 7-8, 9-12, 13-16, 17-24, 25-32, 33+."""
    for bucket, upper in enumerate((1, 2, 3, 4, 6, 8, 12, 16, 24, 32)):
        if position <= upper:
            return bucket
    return 10


class CostModel:
    """Seconds per forward pass as a function of the number of tokens it checks.

    Each observed size keeps its last ``window`` timings and answers with their median (robust
    to a noisy machine); sizes in between are interpolated linearly, larger ones extrapolated.
    The curve need not be monotone: on some CPUs a pass over 4 tokens is faster than over 2.
    """

    def __init__(self, window: int = 15) -> None:
        self.window = window
        self.sizes: list[int] = []
        self.samples: dict[int, deque] = {}
        self.seconds: dict[int, float] = {}  # median of samples, per size

    @property
    def calibrated(self) -> bool:
        return len(self.sizes) >= 2

    def record(self, num_tokens: int, seconds: float) -> None:
        samples = self.samples.get(num_tokens)
        if samples is None:
            samples = self.samples[num_tokens] = deque(maxlen=self.window)
            bisect.insort(self.sizes, num_tokens)
        samples.append(seconds)
        self.seconds[num_tokens] = statistics.median(samples)

    def cost(self, num_tokens: int) -> float:
        """Estimated seconds for one forward pass over ``num_tokens`` tokens."""
        sizes, secs = self.sizes, self.seconds
        if not sizes:
            return float(num_tokens)  # uncalibrated: assume linear
        if num_tokens in secs:
            return secs[num_tokens]
        i = bisect.bisect_left(sizes, num_tokens)
        if i == 0:
            return secs[sizes[0]]
        if len(sizes) == 1:
            return secs[sizes[0]]
        lo, hi = (sizes[i - 1], sizes[i]) if i < len(sizes) else (sizes[-2], sizes[-1])
        slope = (secs[hi] - secs[lo]) / (hi - lo)
        return max(secs[lo] + slope * (num_tokens - lo), 1e-9)

    def calibrate(self, target, probe_token: int, sizes: Sequence[int] = CALIBRATION_SIZES,
                  repeats: int = 2) -> None:
        """Time forward passes of each size on ``target`` at its current cache length, then
        crop the cache back (the cache ends exactly as it started)."""
        length = target.cache_length
        limit = max(1, target.max_context - length)
        target.forward([probe_token])  # warm-up
        target.crop(length)
        for size in sizes:
            if size > limit:
                break
            for _ in range(repeats):
                start = time.perf_counter()
                target.forward([probe_token] * size)
                self.record(size, time.perf_counter() - start)
                target.crop(length)


    def save(self, path: Path) -> None:
        """Store the curve (medians) so the next process skips calibration."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(n): self.seconds[n] for n in self.sizes}))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a calibration next time

    def load(self, path: Path) -> None:
        try:
            curve = json.loads(path.read_text())
            for size, seconds in curve.items():
                self.record(int(size), float(seconds))
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # missing or corrupt: calibrate instead


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

    def rate(self, bucket: int, position: int, prior_rate: float, prior_weight: float) -> float:
        key = (bucket, position_bucket(position))
        return (self.accepted[key] + prior_weight * prior_rate) / (self.reached[key] + prior_weight)


def prior_acceptance(bucket: int) -> float:
    """Before any evidence: trust a draft token more the longer the match that found it."""
    return (0.35, 0.3, 0.45, 0.55, 0.62, 0.7, 0.76, 0.82, 0.87, 0.92)[bucket]


class SpeculationPolicy:
    """Chooses each step's draft length from measured costs and learned acceptance.

    One policy lives with a loaded model (its costs and statistics carry over between
    requests); :meth:`start` begins a request's own statistics.
    """

    def __init__(self, global_weight: float = 4.0, prior_weight: float = 3.0,
                 cost_file: str | os.PathLike | None = None) -> None:
        self.costs = CostModel()
        self.cost_file = Path(cost_file) if cost_file else None
        self.history = {False: AcceptanceModel(), True: AcceptanceModel()}  # by sampling
        self.request: AcceptanceModel = AcceptanceModel()
        self.sampling = False
        self.global_weight = global_weight
        self.prior_weight = prior_weight

    def start(self, target, probe_token: int, sampling: bool) -> None:
        """Begin a request (after the prompt's prefill); calibrate costs on first use."""
        self.request = AcceptanceModel()
        self.sampling = sampling
        if self.cost_file is not None:
            if self.costs.calibrated:
                self.costs.save(self.cost_file)  # keep what the last request refined
            else:
                self.costs.load(self.cost_file)
        if not self.costs.calibrated:
            self.costs.calibrate(target, probe_token)
            if self.cost_file is not None:
                self.costs.save(self.cost_file)

    def acceptance(self, bucket: int, position: int) -> float:
        prior = prior_acceptance(bucket)
        history = self.history[self.sampling].rate(bucket, position, prior, self.prior_weight)
        return self.request.rate(bucket, position, history, self.global_weight)

    def draft_length(self, draft: Sequence[int], match_length: int | None) -> int:
        """How many leading tokens of ``draft`` to verify (0 = a plain step)."""
        if not draft:
            return 0
        bucket = match_bucket(match_length)
        plain_rate = 1.0 / self.costs.cost(1)
        best_k, best_rate = 0, plain_rate
        expected, survive = 1.0, 1.0
        for k in range(1, min(len(draft), MAX_DRAFT) + 1):
            survive *= self.acceptance(bucket, k)
            expected += survive
            rate = expected / self.costs.cost(k + 1)
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
