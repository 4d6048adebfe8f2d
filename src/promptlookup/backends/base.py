"""The *target*: the model being accelerated, seen through the narrow interface the decoding
loop needs. A backend owns a KV cache over the tokens fed so far; it runs forward passes over
new tokens and can crop the cache back after rejected drafts."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class Target(Protocol):
    """What the decoding loop needs from a model backend.

    Positions are implicit: the i-th token fed after a ``reset`` sits at position i.
    """

    #: Longest sequence (prompt + generated tokens) the model accepts.
    max_context: int
    #: Whether :meth:`crop` is supported; without it only plain decoding is possible.
    can_crop: bool

    def reset(self) -> None:
        """Empty the cache (start a new sequence)."""

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Feed tokens into the cache without returning logits (the prompt). A backend may
        hold some back and run them at the start of the next :meth:`forward` (one pass
        instead of two); ``cache_length`` counts them either way."""

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """One forward pass over ``token_ids`` appended to the cache.

        Returns float32 logits of shape ``(len(token_ids), vocab)``: row i predicts the token
        after ``token_ids[i]``.
        """

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions of the cache."""

    def prepare(self, sizes: Sequence[int]) -> None:
        """Set up for forward passes over these numbers of tokens, before they are timed (the
        transformers target chooses its kernels); a no-op for a backend with nothing to set up.
        The loop calls it before every pass, the cost calibration before its passes."""

    @property
    def cache_length(self) -> int:
        """Number of positions in the cache."""
