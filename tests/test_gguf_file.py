"""Our GGUF reader (backends/gguf/file.py) reads what ``gguf.GGUFReader`` reads: every short
metadata value, the lengths of long arrays (a vocabulary), and every tensor's bytes or values
in the same shapes."""

from __future__ import annotations

import gguf
import numpy as np

from promptlookup.backends.gguf.file import GgufFile

T = gguf.GGMLQuantizationType


def test_the_file_reads_as_gguf_reads_it(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_rope_freq_base(12345.5)
    writer.add_token_list([f"t{i}" for i in range(5000)])  # long: only its length is kept
    writer.add_token_scores([-float(i) for i in range(5000)])
    writer.add_array("llama.attention.sliding_window_pattern", [True, False, True])
    writer.add_string("general.name", "mixed")
    writer.add_tensor("a.weight", rng.standard_normal((3, 64)).astype(np.float32))
    writer.add_tensor("b.weight", rng.standard_normal((5, 32)).astype(np.float16))
    values = rng.standard_normal((8, 64)).astype(np.float32)
    writer.add_tensor("c.weight", gguf.quants.quantize(values, T.Q8_0), raw_dtype=T.Q8_0)
    writer.add_tensor("d.weight", gguf.quants.quantize(values, T.BF16), raw_dtype=T.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours, theirs = GgufFile(path), gguf.GGUFReader(str(path))
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        if isinstance(expected, list) and len(expected) > 4096:
            assert len(ours.fields[key]) == len(expected)
        else:
            assert ours.fields[key] == expected, key
    assert ours.fields["llama.rope.freq_base"] == 12345.5
    for mine, read in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.tensor_type, mine.data_offset) == (
            read.name, read.tensor_type, read.data_offset,
        )  # fmt: skip
        assert list(mine.shape) == list(read.shape)
        if mine.tensor_type == T.BF16:  # ours: the float32 values; theirs: the raw halves
            halves = np.asarray(read.data).view(np.uint16).reshape(mine.data.shape)
            assert np.array_equal(mine.data, (halves.astype(np.uint32) << 16).view(np.float32))
            assert np.allclose(mine.data, values, rtol=1e-2)
        else:
            assert np.array_equal(mine.data, read.data), mine.name
