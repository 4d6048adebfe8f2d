"""Linear layers and embeddings over a GGUF file's quantized weights, kept quantized.

:class:`QuantizedLinear` holds a weight matrix as ``quantized_matmul.c`` reads it (panels of 16
outputs, the file's integers and scales, see :mod:`~promptlookup.backends.gguf.blocks`) and
multiplies float32 rows by it in one C call. Each output of each row is one fixed chain of
``fmaf`` over the inputs, so a row's result never depends on the rows beside it: products are
row-invariant by construction, at every row count and thread count
(``tests/test_quantized.py`` checks it). :class:`QuantizedEmbedding` reads rows of the same
layout (a tied embedding and language-model head share one copy).

The kernel is compiled on first use like the attention kernel
(:mod:`~promptlookup.backends.gguf.native_build`); there is no fallback: without a C compiler a
quantized model cannot run here (:func:`available`), and loading asks for float32 instead.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from .blocks import HALF_KINDS, LANES, Blocks, decode, half_exact, pack
from .native_build import compiled

ENVIRONMENT = "PROMPTLOOKUP_QUANTIZED"  #: set to 0 to refuse quantized weights
#: Rows of a file's tensor decoded and packed at a time (a whole number of panels).
CHUNK_ROWS = 2048


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built here."""
    library = compiled(["quantized_matmul.c"], ENVIRONMENT, "quantized matrix-product kernel")
    if library is None:
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.quantized_matmul.restype = i32
    library.quantized_matmul.argtypes = [p, i64, i64, i32, i32, i32, p, i64, p, p, i32]
    library.quantized_rows.restype = None
    library.quantized_rows.argtypes = [p, i64, i64, i32, i32, i32, p, i64, p]
    return library


def available() -> bool:
    """Whether quantized weights can run here (the kernel compiles)."""
    return kernel() is not None


class QuantizedWeight:
    """A weight matrix (``n`` outputs x ``k`` inputs) in panels; ``kind`` is the GGUF type it
    came from; ``half``: whether the panels hold scales and offsets in float16 (by default,
    where they all are float16s exactly)."""

    def __init__(self, blocks: Blocks, kind: str, half: bool | None = None) -> None:
        n, k = blocks.q.shape
        self.n, self.k, self.kind = n, k, kind
        self.block, self.bits, self.has_offset = blocks.block, blocks.bits, blocks.m is not None
        exact = half_exact(blocks)
        if half and not exact:
            raise ValueError(f"{kind} scales or offsets beyond float16's range")
        self.half = exact if half is None else half
        self.panels = torch.from_numpy(pack(blocks, self.half))

    @classmethod
    def from_file(
        cls, kind: str, raw: np.ndarray, k: int, chunk: int | None = None, done=None
    ) -> QuantizedWeight:
        """The tensor of GGUF type ``kind`` in ``raw`` (its bytes, one row of ``k`` inputs per
        row), decoded and packed ``chunk`` rows at a time straight into the whole tensor's
        panels (the temporaries are one chunk's; ``done(rows)`` is called after each chunk
        with the rows packed so far, for the caller to drop their file pages), with float16
        headers for the formats that store float16 scales, unless a value is out of their
        range (one layout for the whole tensor). ``chunk``: :data:`CHUNK_ROWS` by default."""
        chunk = chunk or CHUNK_ROWS
        if chunk % LANES:
            raise ValueError(f"chunks of {chunk} rows split panels of {LANES}")
        if kind in HALF_KINDS:
            try:
                return cls._streamed(kind, raw, k, chunk, True, done)
            except ValueError:  # some scale beyond float16's range: float32 headers throughout
                pass
        return cls._streamed(kind, raw, k, chunk, False, done)

    @classmethod
    def _streamed(cls, kind, raw, k, chunk, half: bool, done) -> QuantizedWeight:
        n = raw.shape[0]
        whole = None
        for first in range(0, n, chunk):
            part = cls(decode(kind, np.asarray(raw[first : first + chunk]), k), kind, half)
            if n <= chunk:  # one chunk: its panels are the tensor's
                whole = part
            else:
                if whole is None:  # the first chunk: the whole tensor's panels, in its layout
                    whole = cls.__new__(cls)
                    whole.__dict__.update(part.__dict__)
                    shape = (-(-n // LANES), part.panels.shape[1])
                    whole.panels = torch.empty(shape, dtype=torch.uint8)
                whole.panels[first // LANES : first // LANES + part.panels.shape[0]] = part.panels
            if done is not None:
                done(min(first + chunk, n))
        whole.n = n
        return whole

    @property
    def nbytes(self) -> int:
        return self.panels.numel()

    @property
    def header(self) -> int:
        """The kernel's header flags: bit 0 offsets, bit 1 float16."""
        return int(self.has_offset) | int(self.half) << 1

    def _layout(self) -> tuple:
        return (self.panels.data_ptr(), self.n, self.k, self.block, self.bits, self.header)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (..., k) float32 times the weight's transpose, plus ``bias``: (..., n)."""
        rows = x.reshape(-1, self.k)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], self.n, dtype=torch.float32)
        status = kernel().quantized_matmul(
            *self._layout(),
            rows.data_ptr(),
            rows.shape[0],
            out.data_ptr(),
            None if bias is None else bias.data_ptr(),
            torch.get_num_threads(),
        )
        if status == -2:
            raise MemoryError("quantized kernel: no memory for a panel's buffer")
        if status != 0:
            raise ValueError(f"quantized kernel refused a {self.kind} layout ({self.k} inputs)")
        return out.reshape(*x.shape[:-1], self.n)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape, int64) of the weight, dequantized: (*ids.shape, k)."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(flat.numel(), self.k, dtype=torch.float32)
        kernel().quantized_rows(*self._layout(), flat.data_ptr(), flat.numel(), out.data_ptr())
        return out.reshape(*ids.shape, self.k)


class QuantizedLinear(torch.nn.Module):
    """``nn.Linear``'s forward over a :class:`QuantizedWeight` (float32 activations)."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.quantized = weight
        self.in_features, self.out_features = weight.k, weight.n
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return self.quantized.matmul(x.to(torch.float32), bias)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.quantized.kind}"


class QuantizedEmbedding(torch.nn.Module):
    """``nn.Embedding``'s forward over a :class:`QuantizedWeight` (rows are tokens)."""

    def __init__(self, weight: QuantizedWeight) -> None:
        super().__init__()
        self.quantized = weight
        self.num_embeddings, self.embedding_dim = weight.n, weight.k

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.quantized.rows(input_ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings} x {self.embedding_dim}, {self.quantized.kind}"


def fused(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """One weight whose outputs are ``weights``' outputs in order (one kernel call for the
    query, key and value projections, say), or None when they cannot share a layout (whole
    panels each, one format). Every output is computed as before: fusing changes no bits."""
    first = weights[0]
    if any(
        (w.k, w.block, w.bits, w.header) != (first.k, first.block, first.bits, first.header)
        or w.n % LANES
        for w in weights
    ):
        return None
    joined = QuantizedWeight.__new__(QuantizedWeight)
    joined.__dict__.update(first.__dict__)
    joined.n = sum(w.n for w in weights)
    joined.kind = "+".join(dict.fromkeys(w.kind for w in weights))
    joined.panels = torch.cat([w.panels for w in weights])
    first_panel = 0  # the parts become views of the joined copy: no second copy is kept
    for w in weights:
        w.panels = joined.panels[first_panel : first_panel + w.n // LANES]
        first_panel += w.n // LANES
    return joined
