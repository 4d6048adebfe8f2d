"""A GGUF file's metadata and tensors, read in a fraction of a second.

``gguf.GGUFReader`` makes a numpy view of every part of every metadata value: a 262,144-token
vocabulary (Gemma 3's tokens, scores and types) is millions of views, 15-35 seconds of a
2-core machine's start-up, twice. The loader needs the scalars, the short arrays and the
tensors: :class:`GgufFile` reads the same layout (GGUF v2/v3: a header, key/value pairs,
tensor infos, aligned data) with ``struct``, steps over long arrays (a string array by its
lengths alone), and gives each tensor as a view of one memory map, in the shapes
``GGUFReader`` gives (quantized: rows of bytes; float: the values, last dimension first).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

#: GGUF value types (``gguf.GGUFValueType``) -> struct formats; 8: string, 9: array.
SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
STRING, ARRAY = 8, 9
#: Arrays longer than this keep only their length (vocabularies; metadata arrays are per layer).
LONGEST_KEPT = 4096
FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


@dataclass
class Tensor:
    """One tensor: ``shape`` in GGUF order (inputs first), ``data`` its values or bytes."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray
    data_offset: int
    n_bytes: int


class LongArray(int):
    """A long array's length (its items were stepped over): ``len()`` gives it too."""

    def __len__(self) -> int:
        return int(self)


class GgufFile:
    """``fields``: every key's value (scalars, strings, lists; a :class:`LongArray` for long
    arrays), ``tensors`` in file order, ``map``: the memory map their data views."""

    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as file:
            self.map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._at = 0
        magic, version = self._read("<4sI")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"not a GGUF v2/v3 file ({magic!r}, version {version})")
        count, keys = self._read("<QQ")
        self.fields = {}
        for _ in range(keys):
            key = self._string()
            (kind,) = self._read("<I")
            self.fields[key] = self._value(kind)
        infos = []
        for _ in range(count):
            name = self._string()
            (dims,) = self._read("<I")
            shape = self._read(f"<{dims}Q")
            kind, offset = self._read("<IQ")
            infos.append((name, shape, GGMLQuantizationType(kind), offset))
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-self._at // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    def _read(self, layout: str) -> tuple:
        values = struct.unpack_from(layout, self.map, self._at)
        self._at += struct.calcsize(layout)
        return values

    def _string(self) -> str:
        (length,) = self._read("<Q")
        self._at += length
        return self.map[self._at - length : self._at].decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind in SCALARS:
            return self._read("<" + SCALARS[kind])[0]
        if kind == STRING:
            return self._string()
        if kind != ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, length = self._read("<IQ")
        if length <= LONGEST_KEPT:
            return [self._value(item) for _ in range(length)]
        if item == STRING:  # step over each string by its length
            for _ in range(length):
                self._at += 8 + struct.unpack_from("<Q", self.map, self._at)[0]
        elif item in SCALARS:
            self._at += length * struct.calcsize(SCALARS[item])
        else:
            raise ValueError("a long GGUF array of arrays")
        return LongArray(length)

    def _tensor(self, start: int, name: str, shape: tuple, kind, offset: int) -> Tensor:
        block, size = GGML_QUANT_SIZES[kind]
        count = int(np.prod(shape))
        n_bytes = count // block * size
        at = start + offset
        if kind.name in FLOATS:
            data = np.frombuffer(self.map, FLOATS[kind.name], count, at).reshape(shape[::-1])
            if kind.name == "BF16":  # the top half of a float32's bits
                data = (data.astype(np.uint32) << 16).view(np.float32)
        else:  # rows of bytes, as GGUFReader gives them
            rows = count // shape[0]
            data = np.frombuffer(self.map, np.uint8, n_bytes, at).reshape(rows, -1)
        return Tensor(name, kind, np.array(shape), data, at, n_bytes)
