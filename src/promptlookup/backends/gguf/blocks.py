"""A GGUF tensor's quantized blocks as integers and scales, and their packing into panels.

Every supported format's weight is ``s * q + m`` per block of ``block`` inputs (``m`` = 0 for
the formats without an offset), with integer ``q`` and float32 ``s`` and ``m`` that hold the
file's numbers exactly (its float16 scales times its small integer sub-scales):

======  =====  =====  =========================================  ====================
format  block  bits   weight                                     packed as
======  =====  =====  =========================================  ====================
Q4_0    32     4      d * (q - 8)                                4 bits, s = d, m = -8d
Q4_1    32     4      d * q + m                                  4 bits
Q4_K    32     4      d * sc * q - dmin * mn  (sub-blocks of 256)  4 bits
Q5_0    32     5      d * (q - 16)                               8 bits
Q5_1    32     5      d * q + m                                  8 bits
Q5_K    32     5      d * sc * q - dmin * mn                     8 bits
Q6_K    16     6      d * sc * (q - 32)                          8 bits
Q8_0    32     8      d * q                                      8 bits
======  =====  =====  =========================================  ====================

:func:`pack` lays them out as ``quantized_matmul.c`` reads them: panels of 16 outputs, each
block a header (16 scales, and 16 offsets where there are any) and its integers input by input.
A worked example, one output row of a Q4_0 tensor with K = 32, d = 0.5 and q = 0..15, 0..15:
``decode`` gives q = [0..15, 0..15], s = [[0.5]], m = [[-4.0]], so the weights are
-4.0, -3.5, ..., 3.5, twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .native_build import bounds

LANES = bounds()["PANEL_LANES"]  #: outputs per panel (``native/bounds.h``)


@dataclass(frozen=True)
class Blocks:
    """One tensor's weights as ``s * q + m``: ``q`` (n, k) integers, ``s``/``m`` (n, k // block)
    float32 (``m`` None: no offsets), each stored in ``bits`` (4 or 8) bits when packed."""

    q: np.ndarray
    s: np.ndarray
    m: np.ndarray | None
    block: int
    bits: int


def _half(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 bytes (..., 2) as float32 (...)."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit layout (..., 16) bytes -> (..., 32): low nibbles first, then high nibbles."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit sub-block scales and mins -> (..., 8) each."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 2) & 48)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 2) & 48)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def decode(kind: str, raw: np.ndarray, k: int) -> Blocks:
    """The blocks of a tensor of ``kind`` (a GGML type name) with rows of ``k`` inputs, from
    its raw bytes ``raw`` (n, bytes per row)."""
    n = raw.shape[0]
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}[kind]
        blocks = raw.reshape(n, k // 32, size)
        d = _half(blocks[..., 0:2].reshape(n, k // 32, 1, 2)).reshape(n, k // 32)
        if kind == "Q8_0":
            q = blocks[..., 2:].view(np.int8)
            return Blocks(q.reshape(n, k), d, None, 32, 8)
        offset = _half(blocks[..., 2:4].reshape(n, k // 32, 1, 2)).reshape(n, k // 32)
        if kind == "Q4_0":
            return Blocks(_nibbles(blocks[..., 2:]).reshape(n, k), d, -8 * d, 32, 4)
        if kind == "Q4_1":
            return Blocks(_nibbles(blocks[..., 4:]).reshape(n, k), d, offset, 32, 4)
        start = 2 if kind == "Q5_0" else 4
        high = np.unpackbits(blocks[..., start : start + 4], axis=-1, bitorder="little")
        q = _nibbles(blocks[..., start + 4 :]) | (high << 4)
        if kind == "Q5_0":
            return Blocks(q.reshape(n, k), d, -16 * d, 32, 8)
        return Blocks(q.reshape(n, k), d, offset, 32, 8)
    if kind in ("Q4_K", "Q5_K"):
        size = 144 if kind == "Q4_K" else 176
        blocks = raw.reshape(n, k // 256, size)
        d = _half(blocks[..., 0:2].reshape(n, k // 256, 1, 2))  # (n, blocks, 1)
        dmin = _half(blocks[..., 2:4].reshape(n, k // 256, 1, 2))
        sc, mn = _scale_min_k4(blocks[..., 4:16])
        if kind == "Q4_K":
            qs = blocks[..., 16:].reshape(n, k // 256, 4, 32)  # 64 inputs per 32 bytes
            q = np.stack([qs & 15, qs >> 4], axis=3)  # (n, blocks, 4, 2, 32)
        else:
            qh = blocks[..., 16:48]  # bit i of byte l: input 32 * i + l's fifth bit
            qs = blocks[..., 48:].reshape(n, k // 256, 4, 32)
            low = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, k // 256, 8, 32)
            bits = np.stack([(qh >> i) & 1 for i in range(8)], axis=2)  # (n, blocks, 8, 32)
            q = low | (bits << 4)
        s = (d * sc).reshape(n, k // 32)
        m = -(dmin * mn).reshape(n, k // 32)
        return Blocks(q.reshape(n, k), s, m, 32, 4 if kind == "Q4_K" else 8)
    if kind == "Q6_K":
        blocks = raw.reshape(n, k // 256, 210)
        ql = blocks[..., 0:128].reshape(n, k // 256, 2, 64)
        qh = blocks[..., 128:192].reshape(n, k // 256, 2, 32)
        sc = blocks[..., 192:208].view(np.int8).astype(np.float32)  # (n, blocks, 16)
        d = _half(blocks[..., 208:210].reshape(n, k // 256, 1, 2))
        low = np.concatenate([ql & 15, ql >> 4], axis=-1).reshape(n, k // 256, 2, 4, 32)
        high = np.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], axis=3)
        q = (low | (high << 4)).astype(np.int16) - 32
        return Blocks(q.astype(np.int8).reshape(n, k), (d * sc).reshape(n, k // 16), None, 16, 8)
    raise ValueError(f"no packed layout for {kind}")


DECODED = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
#: Formats whose scales (and offsets: -8d, -16d, or the file's m) are float16s: packed with
#: float16 headers unless some value is out of float16's range (see :func:`half_exact`).
HALF_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def half_exact(blocks: Blocks) -> bool:
    """Whether every scale and offset of ``blocks`` is a float16 exactly (then the panels may
    hold them in 2 bytes instead of 4, with the same values)."""
    with np.errstate(over="ignore"):
        return all(
            np.array_equal(part.astype(np.float16).astype(np.float32), part)
            for part in (blocks.s, blocks.m)
            if part is not None
        )


def pack(blocks: Blocks, half: bool = False) -> np.ndarray:
    """``blocks`` in panels (uint8, one row of bytes per panel), as ``quantized_matmul.c``
    reads them, scales and offsets in float16 with ``half`` (the caller checks
    :func:`half_exact`), else float32; outputs past n (up to a whole panel) are zero."""
    header_type = np.float16 if half else np.float32
    n, k = blocks.q.shape
    panels, per = -(-n // LANES), k // blocks.block
    pad = panels * LANES - n

    def lanes_last(a: np.ndarray) -> np.ndarray:  # (n, ...) -> (panels, ..., LANES)
        a = np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        return np.ascontiguousarray(np.moveaxis(a.reshape(panels, LANES, *a.shape[1:]), 1, -1))

    header = [lanes_last(blocks.s.astype(header_type)).view(np.uint8)]  # (panels, per, 64 or 32)
    if blocks.m is not None:
        header.append(lanes_last(blocks.m.astype(header_type)).view(np.uint8))
    q = lanes_last(blocks.q.reshape(n, per, blocks.block))  # (panels, per, block, LANES)
    if blocks.bits == 4:
        q = q.astype(np.uint8)
        q = q[:, :, 0::2] | (q[:, :, 1::2] << 4)  # (panels, per, block / 2, LANES)
    data = q.astype(np.int8).view(np.uint8).reshape(panels, per, -1)
    return np.ascontiguousarray(np.concatenate([*header, data], axis=-1).reshape(panels, -1))


def dequantize(blocks: Blocks) -> np.ndarray:
    """The weights (n, k) float32 that the kernel computes with: ``fmaf(q, s, m)`` each."""
    n, k = blocks.q.shape
    per = k // blocks.block
    q = blocks.q.astype(np.float64).reshape(n, per, blocks.block)
    m = 0.0 if blocks.m is None else blocks.m[..., None].astype(np.float64)
    # q * s is exact in float64 and so is the sum's single rounding to float32 (as fmaf's).
    return (q * blocks.s[..., None].astype(np.float64) + m).astype(np.float32).reshape(n, k)
