"""What a forward pass of the target costs, as a function of the number of tokens it checks.

Measured on the actual hardware, model and dtype (timed passes on first use,
:mod:`promptlookup.calibration`, then every pass of every request), and kept relative to a
tracked speed level; see :class:`CostModel`. A :class:`~promptlookup.cost_store.CostStore`
keeps one per context length, and the policy (:mod:`promptlookup.policy`) prices drafts with it.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import deque
from pathlib import Path


class CostModel:
    """Seconds per forward pass as a function of the number of tokens it checks.

    The machine's speed drifts: on a shared virtual machine a neighbour can make *every* pass
    much slower for tens of seconds, then let go. So the curve
    is kept in relative terms, ``cost(n) = level * shape(n)``: each pass is recorded as its
    seconds divided by the current *level* (seconds per unit of shape), and the level is the
    median of what the last ``LEVEL_WINDOW`` passes imply (each pass's seconds over its size's
    shape). A slow spell then raises the level, not the cost of whichever sizes happened to be
    measured during it; the policy compares sizes only, so its choices depend on the shape.

    Each measured size keeps the median of its recent relative costs (a window per size, so
    sizes the policy stops using keep their calibration). A size's median is trusted in
    proportion to its number of samples: it is shrunk towards a least-squares line through all
    sizes >= 2 (weighted by their samples) as ``(count * median + SHRINK * line) / (count +
    SHRINK)``, so a single noisy pass cannot bend the curve into a shape that keeps the policy
    away from a size for good. The points are joined by straight lines, and beyond the largest
    measured size the curve follows the line's slope. It need not be monotone: a pass over a few
    tokens can cost *less* than over one (float32 matrix products on some CPUs, see
    :mod:`promptlookup.backends.gguf.linear`), and the policy should know it. Estimates are kept
    within ``[cost(1) / 2, n * cost(1)]`` (never dearer than n separate passes; anything more
    than twice cheaper than one token is noise).

    Example: calibrated at 1 token = 60 ms and 16 tokens = 72 ms (shape 1 and 1.2), a spell
    of 100 ms one-token passes moves the level to 100 ms within a few passes, and a 16-token pass
    timed then at 120 ms is recorded as 1.2 again, not as "16 tokens cost 2x one".
    """

    #: Samples at which a size's own median weighs as much as the line through all sizes.
    SHRINK = 3.0
    #: Recent passes whose median sets the level (a slow spell is followed within half of it).
    LEVEL_WINDOW = 5

    def __init__(self, window: int = 32) -> None:
        self.window = window
        self.samples: dict[int, deque[float]] = {}  # tokens -> recent relative costs
        self.levels: deque[float] = deque(maxlen=self.LEVEL_WINDOW)  # implied seconds per unit
        self._level: float | None = None  # their median, cached
        self._curve: list[tuple[int, float]] | None = None  # (tokens, relative cost), cached
        self._line: tuple[float, float] = (0.0, 0.0)

    @property
    def calibrated(self) -> bool:
        return 1 in self.samples and len(self.samples) >= 3

    @property
    def sizes(self) -> list[int]:
        return sorted(self.samples) if 1 in self.samples else []

    @property
    def level(self) -> float:
        """Seconds per unit of relative cost, now (1.0 before the first pass)."""
        if self._level is None:
            self._level = statistics.median(self.levels) if self.levels else 1.0
        return self._level

    def record(self, num_tokens: int, seconds: float, level: float | None = None) -> None:
        """Note a pass over ``num_tokens`` tokens that took ``seconds``, relative to ``level``
        (default: the current level; calibration passes the time of the one-token pass just
        before, so its ratios are measured in pairs, :func:`promptlookup.calibration.time_passes`)."""
        n = max(num_tokens, 1)
        if not self.levels:  # the first pass sets the scale
            self.levels.append(seconds if level is None else level)
            self._level = None
        if level is None:
            level = self.level
        if n in self.samples:  # a size with a shape already: its pass also measures the level
            self.levels.append(seconds / self._relative(n))
        self.samples.setdefault(n, deque(maxlen=self.window)).append(seconds / level)
        self._curve = self._level = None

    def curve(self) -> list[tuple[int, float]]:
        """The points joined by the curve: (tokens, relative cost), by tokens (see the class doc)."""
        if self._curve is None:
            medians = {n: (statistics.median(v), len(v)) for n, v in sorted(self.samples.items())}
            self._line = a, b = self._fit([(n, m, c) for n, (m, c) in medians.items() if n >= 2])
            self._curve = [
                (n, m if n == 1 else (c * m + self.SHRINK * (a + b * n)) / (c + self.SHRINK))
                for n, (m, c) in medians.items()
            ]
        return self._curve

    @staticmethod
    def _fit(points: list[tuple[int, float, int]]) -> tuple[float, float]:
        """``(a, b)`` of the weighted least-squares line ``a + b * n`` (``b >= 0``) through
        ``(n, seconds, weight)`` points; a flat line through a single point."""
        if not points:
            return 0.0, 0.0
        total = sum(w for _, _, w in points)
        mean_n = sum(n * w for n, _, w in points) / total
        mean_s = sum(s * w for _, s, w in points) / total
        var = sum(w * (n - mean_n) ** 2 for n, _, w in points)
        slope = (
            max(sum(w * (n - mean_n) * (s - mean_s) for n, s, w in points) / var, 0.0)
            if var
            else 0.0
        )
        return mean_s - slope * mean_n, slope

    def _relative(self, n: int) -> float:
        """The curve's relative cost of a pass over ``n`` tokens: a measured size's point,
        joined linearly between sizes, continued by the fitted slope beyond the largest."""
        points = self.curve()
        index = bisect.bisect_left(points, (n, -math.inf))
        if index < len(points) and points[index][0] == n:
            return points[index][1]
        if index < len(points):  # between two measured sizes
            (n0, s0), (n1, s1) = points[index - 1], points[index]
            return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
        last_n, last_s = points[-1]  # beyond the largest measured size
        return last_s + self._line[1] * (n - last_n)

    def cost(self, num_tokens: int) -> float:
        """Estimated seconds for one forward pass over ``num_tokens`` tokens, now."""
        if 1 not in self.samples:
            return float(num_tokens)  # uncalibrated: assume linear
        n = max(num_tokens, 1)
        one = self.curve()[0][1]
        return self.level * min(max(self._relative(n), one / 2), one * n)

    def seed(self, other: CostModel) -> None:
        """Start from ``other``'s curve and level: one sample per measured size, so this
        model's own passes soon outweigh the copy."""
        for n, relative in other.curve():
            self.samples[n] = deque([relative], maxlen=self.window)
        self.levels.append(other.level)
        self._curve = self._level = None

    def save(self, path: Path) -> None:
        """Store the recent relative costs and level so the next process skips calibration."""
        from .cache_files import save_cache_json

        save_cache_json(
            path,
            {
                "levels": list(self.levels),
                "relative": [(n, r) for n, v in self.samples.items() for r in v],
            },
        )

    def load(self, path: Path) -> None:
        try:
            saved = json.loads(path.read_text())
            if "plain" in saved:  # a curve kept in seconds (as the replay's committed curves are)
                one = statistics.median(float(seconds) for seconds in saved["plain"])
                saved = {
                    "levels": [one],
                    "relative": [(1, float(seconds) / one) for seconds in saved["plain"]]
                    + [(n, float(seconds) / one) for n, seconds in saved["verify"]],
                }
            levels = [float(level) for level in saved["levels"]]
            relative = [(int(n), float(r)) for n, r in saved["relative"]]
        except (
            OSError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            statistics.StatisticsError,
        ):
            return  # missing, corrupt or of another format: calibrate instead
        self.levels.extend(levels)
        for n, r in relative:
            self.samples.setdefault(max(n, 1), deque(maxlen=self.window)).append(r)
        self._curve = self._level = None
