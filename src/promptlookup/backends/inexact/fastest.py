"""The inexact kernels: the fastest product by timing, whatever its rounding.

Only the bench's ``promptlookup-fastest`` method uses them (a target built with
``row_invariant=False``), to measure what exactness costs in the same run: with them a draft
or a batch may change a token. Everything else in :mod:`~promptlookup.backends` that a
row-invariant pass runs computes each row as a one-token pass would
(:class:`~promptlookup.backends.gguf.linear.LinearKernels`, the native and quantized kernels); the
attention such a target runs instead (``grouped_sdpa``, and the blocked prompt attention it
times) is in :mod:`~promptlookup.backends.inexact.attention`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...machine import memory_bytes
from ..gguf.linear import LinearKernels

#: Packed copies of the weights may take at most this share of the machine's memory.
PACKING_MEMORY_SHARE = 0.25


class FastestKernels(LinearKernels):
    """:class:`~promptlookup.backends.gguf.linear.LinearKernels` timing every kernel against
    ``nn.Linear`` with no bit-for-bit check and no padding of one row to two; float32 one-row
    products keep ``nn.Linear`` (plain steps stay bit-identical to transformers')."""

    row_invariant = False

    def _can_pack(self) -> bool:
        """Packing only where the reordered copies fit in :data:`PACKING_MEMORY_SHARE` of the
        machine's memory (they double the weights')."""
        if not torch.backends.mkldnn.is_available():
            return False
        weight_bytes = sum(
            m.weight.numel() * m.weight.element_size()
            for modules in self.groups.values()
            for m in modules
        )
        memory = memory_bytes()  # 0 when unknown: no packing
        return memory > 0 and weight_bytes <= PACKING_MEMORY_SHARE * memory

    def _choice(self, key: tuple, modules: list[torch.nn.Linear], rows: int) -> str | None:
        if rows == 1 and key[2] == torch.float32:
            return None
        kernel = self._fastest(modules, rows)
        return None if kernel == "linear" else kernel

    def _known(self) -> set[str]:
        return set(self.kernels)

    def _forward(self, kernel: str, module: torch.nn.Linear) -> Callable:
        return self._plain_forward(kernel, module)

    def _candidates(self, module: torch.nn.Linear, rows: int) -> tuple[list[str], str]:
        return list(self.kernels), "linear"
