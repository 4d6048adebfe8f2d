"""Timing forward passes of a target for the speculation policy's cost curves.

The policy (:mod:`promptlookup.policy`) only decides, from curves it is given; the code that
prepares a target for a request (the loop after its prefill, the batch decoder before it admits
sequences) runs these passes when the policy has no measured curve yet
(:meth:`~promptlookup.policy.SpeculationPolicy.calibration_plan`), and hands it the timings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .backends.base import Target


def calibrate(target: Target, policy, probe_token: int) -> None:
    """Time passes of ``probe_token`` on ``target`` at its current cache length when
    ``policy`` (a :class:`~promptlookup.policy.SpeculationPolicy`, or the null policy, which
    asks for none) has no cost curve for it; the cache ends as it started."""
    sizes, repeats = policy.calibration_plan(target.cache_length)
    if sizes:
        timings = time_passes(target, probe_token, sizes, repeats)
        policy.record_calibration(target.cache_length, timings)


def calibrate_alone(target: Target, policy, probe_token: int) -> None:
    """:func:`calibrate` on the target's own cache holding ``probe_token`` alone (the batch
    decoder's sequences have caches of their own); the cache is left empty."""
    if policy.calibration_plan(1)[0]:
        target.reset()
        target.prefill([probe_token])
        calibrate(target, policy, probe_token)
        target.reset()


def time_passes(
    target: Target, probe_token: int, sizes: Sequence[int], repeats: int
) -> list[tuple[int, float, float]]:
    """``(size, seconds, seconds of the one-token pass just before)`` of passes over ``size``
    copies of ``probe_token``, each size in turn ``repeats`` times, at ``target``'s current
    cache length, which every pass is cropped back to (sizes beyond the context are left out)."""
    length = target.cache_length
    limit = max(1, target.max_context - length)
    target.prepare([size for size in sizes if size <= limit])  # set up before timing

    def timed(size: int) -> float:
        start = time.perf_counter()
        target.forward([probe_token] * size)
        seconds = time.perf_counter() - start
        target.crop(length)
        return seconds

    timed(1)  # warm-up
    timings = []
    for _ in range(repeats):
        for size in sizes:
            if size > limit:
                break
            # Each size right after a one-token pass, so their ratio is measured in pairs.
            one = timed(1)
            timings.append((1, one, one))
            if size > 1:
                timings.append((size, timed(size), one))
    return timings
