"""The measured cost curves of one setup, one per context length, kept on disk between runs.

The cost curve is kept per context length (up to 1,024 tokens, then one per doubling): with a
long cache, attention makes a pass over many tokens relatively dearer than over one, so a curve
measured after a short prompt would make drafts after a long one look cheaper than they are.
A context length's curve starts as a copy of the nearest one measured (one sample per size, so
its own passes soon outweigh the copy) rather than being timed inside the first long request;
only a store that has measured nothing yet calibrates there, with forward passes of the target.
"""

from __future__ import annotations

import os
from pathlib import Path

from .cost_model import QUICK_CALIBRATION_SIZES, CostModel

#: Context buckets are 0 .. LAST_CONTEXT_BUCKET (see :func:`context_bucket`).
LAST_CONTEXT_BUCKET = 5


def context_bucket(context_length: int) -> int:
    """Group cache lengths, whose attention makes long passes dearer: up to 1,024 tokens -> 0,
    then one bucket per doubling (2,048 -> 1, 4,096 -> 2, ...), beyond 16,384 -> 5."""
    return min(max(0, (max(context_length, 1) - 1).bit_length() - 10), LAST_CONTEXT_BUCKET)


class CostStore:
    """One :class:`~promptlookup.cost_model.CostModel` per context bucket; ``current`` is the
    one of the request under way. ``cost_file`` (optional) is where bucket 0's curve is kept;
    bucket ``b``'s goes beside it as ``<stem>-context<b>.json``."""

    def __init__(self, cost_file: str | os.PathLike | None = None) -> None:
        #: One measured cost curve per context bucket (see :func:`context_bucket`).
        self.curves: dict[int, CostModel] = {}
        self.context = 0  # the current request's context bucket
        self.current = self.curves.setdefault(0, CostModel())
        self.cost_file = Path(cost_file) if cost_file else None
        self._loaded: set[int] = set()  # context buckets whose cost file was read

    def begin(self, target, probe_token: int) -> CostModel:
        """The curve for a request whose prompt is in ``target``'s cache: saves what the last
        request refined, then picks the curve of this context length; a length without one
        starts from the nearest measured curve, and only a store that has measured none
        calibrates (forward passes of ``probe_token`` on ``target``, the cache left as it was)."""
        if self.current.calibrated:
            self.save()  # keep what the last request refined
        self.context = context_bucket(target.cache_length)
        self.current = costs = self._stored_curve(self.context)
        if not costs.calibrated:
            measured = [
                bucket
                for bucket in range(LAST_CONTEXT_BUCKET + 1)
                if bucket != self.context and self._stored_curve(bucket).calibrated
            ]
            nearest = min(measured, key=lambda bucket: abs(bucket - self.context), default=None)
            if nearest is not None:  # refined by this request's own passes
                costs.seed(self.curves[nearest])
            elif self.context == 0:
                costs.calibrate(target, probe_token)
            else:  # passes after a long cache are slow: a quick curve, refined online
                costs.calibrate(target, probe_token, sizes=QUICK_CALIBRATION_SIZES, repeats=1)
            self.save()
        return costs

    def _stored_curve(self, bucket: int) -> CostModel:
        """Context ``bucket``'s curve, loaded from its file on first use (uncalibrated if
        there is none)."""
        costs = self.curves.get(bucket) or CostModel()
        if not costs.calibrated and bucket not in self._loaded and self.path(bucket):
            self._loaded.add(bucket)
            costs.load(self.path(bucket))
        if costs.calibrated or bucket == self.context:  # else nothing measured for that length
            self.curves[bucket] = costs
        return costs

    def path(self, bucket: int | None = None) -> Path | None:
        """The cost file of context ``bucket`` (default: the current one; bucket 0 uses
        ``cost_file`` itself)."""
        bucket = self.context if bucket is None else bucket
        if self.cost_file is None or bucket == 0:
            return self.cost_file
        return self.cost_file.with_name(f"{self.cost_file.stem}-context{bucket}.json")

    def save(self) -> None:
        """Store the current curve in its file (when there is a file)."""
        if self.path() is not None:
            self.current.save(self.path())
