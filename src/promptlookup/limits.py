"""The limits the library, the server and the bench share, torch-free: the sampling settings
and the ranges they are taken in, so that the server's request models and the bench check the
same numbers (:class:`SamplingParams`; the token choice they configure is
:mod:`promptlookup.sampling`): beyond them, dividing or multiplying the logits leaves float32's
range (inf, then NaN probabilities). And how many tenants a server keeps state for
(:data:`MAX_TENANTS`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .errors import InvalidParameterError

#: The smallest temperature above 0 (greedy) that sampling takes.
MIN_TEMPERATURE = 1e-4
#: Repetition penalties taken (1.0: off).
REPETITION_PENALTY_RANGE = (0.01, 100.0)
#: Most tenants whose state a server keeps (a cross-request index, with ``--cross-request
#: per-tenant``, and the speculation policy's acceptance history each), the least recently
#: used forgotten first.
MAX_TENANTS = 16


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` means greedy. ``top_k=0`` and ``top_p=1`` switch those filters off.

    Temperatures between 0 and :data:`MIN_TEMPERATURE`, and repetition penalties outside
    :data:`REPETITION_PENALTY_RANGE`, are refused: dividing or multiplying the logits by them
    leaves float32's range (inf, then NaN probabilities)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, value: object, rule: str) -> InvalidParameterError:
            return InvalidParameterError(f"{name} must be {rule}, got {value!r}")

        if not (
            isinstance(self.temperature, (int, float))
            and not isinstance(self.temperature, bool)
            and math.isfinite(self.temperature)
            and (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE)
        ):
            raise bad("temperature", self.temperature, f"0 (greedy) or >= {MIN_TEMPERATURE}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", self.top_k, "an integer >= 0 (0 = off)")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise bad("top_p", self.top_p, "in (0, 1]")
        low, high = REPETITION_PENALTY_RANGE
        if not (
            isinstance(self.repetition_penalty, (int, float))
            and low <= self.repetition_penalty <= high
        ):
            raise bad("repetition_penalty", self.repetition_penalty, f"in [{low}, {high}]")
        for name in ("temperature", "top_p", "repetition_penalty"):  # an integer 2 means 2.0
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The settings' names: the keywords of ``generate``/``stream``, of the CLI's flags
        (``--top-k`` is top_k) and of the server's request fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def as_kwargs(self) -> dict:
        """The settings as ``generate``'s keyword arguments: ``lm.generate(p, **s.as_kwargs())``."""
        return {name: getattr(self, name) for name in self.keywords()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
