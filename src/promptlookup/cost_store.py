"""The measured cost curves of one setup: one per context length, kept on disk between runs, and
one per batch size.

The cost curve is kept per context length (up to 1,024 tokens, then one per doubling): with a
long cache, attention makes a pass over many tokens relatively dearer than over one, so a curve
measured after a short prompt would make drafts after a long one look cheaper than they are.
A context length's curve starts as a copy of the nearest one measured (one sample per size, so
its own passes soon outweigh the copy); only a store that has measured nothing yet asks for
timed passes (:meth:`CostStore.calibration_plan`, run by :mod:`promptlookup.calibration`).
Passes over several sequences have curves of their own, by batch size, in memory only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .cost_model import CostModel

#: Context buckets are 0 .. LAST_CONTEXT_BUCKET (see :func:`context_bucket`).
LAST_CONTEXT_BUCKET = 5
#: Draft lengths + 1 timed before the first request (others are interpolated).
CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: The same for a first request after a long cache, whose passes are slower (the curve's line
#: extends to longer drafts).
QUICK_CALIBRATION_SIZES = (1, 2, 4, 8, 16)


def context_bucket(context_length: int) -> int:
    """Group cache lengths, whose attention makes long passes dearer: up to 1,024 tokens -> 0,
    then one bucket per doubling (2,048 -> 1, 4,096 -> 2, ...), beyond 16,384 -> 5."""
    return min(max(0, (max(context_length, 1) - 1).bit_length() - 10), LAST_CONTEXT_BUCKET)


class CostStore:
    """One :class:`~promptlookup.cost_model.CostModel` per context bucket and one per batch size.
    ``cost_file`` (optional) is where bucket 0's curve is kept; bucket ``b``'s goes beside it
    as ``<stem>-context<b>.json``. A bucket's curve is saved when passes start being recorded
    in another bucket, and after it is calibrated."""

    def __init__(self, cost_file: str | os.PathLike | None = None) -> None:
        #: One measured cost curve per context bucket (see :func:`context_bucket`).
        self.curves: dict[int, CostModel] = {}
        #: Curves of passes over several sequences, by batch size.
        self.batch_curves: dict[int, CostModel] = {}
        self.cost_file = Path(cost_file) if cost_file else None
        self._loaded: set[int] = set()  # context buckets whose cost file was read
        self._recording: int | None = None  # the bucket whose passes were recorded last

    def curve(self, context_length: int = 0, batch_size: int = 1) -> CostModel:
        """The cost curve of passes over ``batch_size`` sequences after ``context_length``
        cached tokens: one sequence's by its context bucket (a bucket without one starts from
        the nearest measured curve); several sequences' by their number, starting from the
        short-context curve and learning from their own passes."""
        if batch_size > 1:
            curve = self.batch_curves.get(batch_size)
            if curve is None:
                curve = self.batch_curves[batch_size] = CostModel()
                if self.curve(0).calibrated:
                    curve.seed(self.curve(0))
            return curve
        bucket = context_bucket(context_length)
        costs = self._stored_curve(bucket)
        if not costs.calibrated:
            measured = [
                other
                for other in range(LAST_CONTEXT_BUCKET + 1)
                if other != bucket and self._stored_curve(other).calibrated
            ]
            nearest = min(measured, key=lambda other: abs(other - bucket), default=None)
            if nearest is not None:  # refined by this bucket's own passes
                costs.seed(self.curves[nearest])
        self.curves[bucket] = costs
        return costs

    def calibration_plan(self, context_length: int) -> tuple[tuple[int, ...], int]:
        """The pass sizes to time before a request after ``context_length`` cached tokens, and
        how many rounds: none once any curve is measured (or read from a file); else every
        size of a short context, three times, or one quick round after a long cache."""
        if self.curve(context_length).calibrated:
            return (), 0
        if context_bucket(context_length) == 0:
            return CALIBRATION_SIZES, 3
        return QUICK_CALIBRATION_SIZES, 1

    def record(
        self, num_tokens: int, seconds: float, context_length: int = 0, batch_size: int = 1
    ) -> None:
        """Note a pass over ``num_tokens`` tokens of ``batch_size`` sequences that took
        ``seconds`` after ``context_length`` cached tokens."""
        if batch_size == 1:
            bucket = context_bucket(context_length)
            if self._recording not in (None, bucket):
                self.save(self._recording)  # keep what the last bucket's passes refined
            self._recording = bucket
        self.curve(context_length, batch_size).record(num_tokens, seconds)

    def record_calibration(
        self, context_length: int, timings: Iterable[tuple[int, float, float]]
    ) -> None:
        """Timed passes ``(tokens, seconds, seconds of the one-token pass just before)`` after
        ``context_length`` cached tokens, each recorded as a ratio to its one-token pass (so a
        slow spell that starts mid-calibration cannot bend the curve); then saved."""
        costs = self.curve(context_length)
        for size, seconds, one in timings:
            costs.record(size, seconds, level=one)
        self.save(context_bucket(context_length))

    def _stored_curve(self, bucket: int) -> CostModel:
        """Context ``bucket``'s curve, loaded from its file on first use (uncalibrated if
        there is none)."""
        costs = self.curves.get(bucket) or CostModel()
        if not costs.calibrated and bucket not in self._loaded and self.path(bucket):
            self._loaded.add(bucket)
            costs.load(self.path(bucket))
        if costs.calibrated:
            self.curves[bucket] = costs
        return costs

    def path(self, bucket: int = 0) -> Path | None:
        """The cost file of context ``bucket`` (bucket 0 uses ``cost_file`` itself)."""
        if self.cost_file is None or bucket == 0:
            return self.cost_file
        return self.cost_file.with_name(f"{self.cost_file.stem}-context{bucket}.json")

    def save(self, bucket: int = 0) -> None:
        """Store ``bucket``'s curve in its file (when there is a file and a measured curve)."""
        curve = self.curves.get(bucket)
        if self.path(bucket) is not None and curve is not None and curve.calibrated:
            curve.save(self.path(bucket))
