"""Drafters: cheap guessers of the next tokens (see :mod:`.base` for the protocol)."""

from __future__ import annotations

from typing import Callable, Sequence, Union

from ..errors import InvalidParameterError
from .base import CallableDrafter, ChainDrafter, Drafter, NoDrafter
from .prompt_lookup import PromptLookupDrafter
from .suffix_index import Match, SuffixIndex

#: What ``drafter=`` accepts: a name, a drafter, a callable, None, or a list of those (a chain).
DrafterSpec = Union[str, Drafter, Callable, None, Sequence]

__all__ = ["CallableDrafter", "ChainDrafter", "Drafter", "DrafterSpec", "Match", "NoDrafter",
           "PromptLookupDrafter", "SuffixIndex", "make_drafter"]


def make_drafter(spec: DrafterSpec = "prompt-lookup", *, eos_token_ids: Sequence[int] = (),
                 **options) -> Drafter:
    """Build a fresh drafter from a spec.

    >>> make_drafter("prompt-lookup", num_tokens=4)
    PromptLookupDrafter(num_tokens=4, min_match=1, max_match=64)
    >>> make_drafter("none")
    NoDrafter()
    """
    if spec is None or spec == "none":
        if options:
            raise InvalidParameterError(f"drafter 'none' takes no options, got {sorted(options)}")
        return NoDrafter()
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if len(parts) > 1:
            return ChainDrafter([make_drafter(p, eos_token_ids=eos_token_ids, **options) for p in parts])
        name = parts[0] if parts else ""
        if name == "prompt-lookup":
            try:
                return PromptLookupDrafter(eos_token_ids=eos_token_ids, **options)
            except (TypeError, ValueError) as exc:
                raise InvalidParameterError(f"prompt-lookup drafter: {exc}") from exc
        raise InvalidParameterError(f"unknown drafter {spec!r}; choose prompt-lookup or none")
    if isinstance(spec, (list, tuple)):
        return ChainDrafter([make_drafter(s, eos_token_ids=eos_token_ids, **options) for s in spec])
    if hasattr(spec, "propose") and hasattr(spec, "update"):
        return spec
    if callable(spec):
        return CallableDrafter(spec)
    raise InvalidParameterError(f"not a drafter: {spec!r}")
