"""The C kernels' build: several sources, each its own translation unit, linked into one
library, cached under a key that covers every source and header it reads (so that any edit
compiles anew); and the kernels' bounds, written once in ``native/bounds.h``."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from promptlookup.backends.gguf import native_attention, native_build, row_invariant
from promptlookup.backends.gguf.blocks import LANES

needs_compiler = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler here"
)


def _write_sources(folder) -> None:
    (folder / "twice.h").write_text("#define FACTOR 2\nint twice(int x);\n")
    (folder / "twice.c").write_text('#include "twice.h"\nint twice(int x) { return FACTOR * x; }\n')
    (folder / "main.c").write_text(
        '#include "twice.h"\nint four_times(int x) { return twice(twice(x)); }\n'
    )


def test_the_cache_key_covers_every_source_and_header(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    _write_sources(tmp_path)
    sources = [tmp_path / "main.c", tmp_path / "twice.c"]
    assert native_build.read_files(sources) == [*sources[:1], tmp_path / "twice.h", sources[1]]
    first = native_build.library_path(sources, "cc")
    assert first.name.startswith("main-")
    (tmp_path / "twice.h").write_text("#define FACTOR 3\nint twice(int x);\n")
    second = native_build.library_path(sources, "cc")
    (tmp_path / "twice.c").write_text('#include "twice.h"\nint twice(int x) { return x + x; }\n')
    third = native_build.library_path(sources, "cc")
    assert len({first, second, third}) == 3
    assert native_build.library_path(sources[:1], "cc") != third  # the sources linked, too


@needs_compiler
def test_several_sources_link_into_one_library(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "NATIVE", tmp_path)
    _write_sources(tmp_path)
    library = native_build.compiled(["main.c", "twice.c"], "PROMPTLOOKUP_TEST_BUILD", "test")
    assert library is not None and library.four_times(ctypes.c_int(5)) == 20
    (tmp_path / "twice.h").write_text("#define FACTOR 3\nint twice(int x);\n")
    rebuilt = native_build.compiled(["main.c", "twice.c"], "PROMPTLOOKUP_TEST_BUILD", "test")
    assert rebuilt.four_times(ctypes.c_int(5)) == 45  # compiled anew, not the cached library
    assert len(list((tmp_path / "cache" / "native").glob("main-*.so"))) == 2


def test_the_kernels_bounds_are_read_from_their_header():
    bounds = native_build.bounds()
    element_types = {"ELEMENT_FLOAT32", "ELEMENT_BFLOAT16", "ELEMENT_FLOAT16"}
    assert set(bounds) == {"KEY_BLOCK", "MAX_GROUP", "MAX_DIM", "PANEL_LANES"} | element_types
    # The element type codes the kernels take, one per dtype the attention reads.
    assert sorted(native_attention.ELEMENT_TYPES.values()) == sorted(
        bounds[name] for name in element_types
    )
    assert row_invariant.KEY_BLOCK == bounds["KEY_BLOCK"]
    assert (native_attention.MAX_GROUP, native_attention.MAX_DIM) == (
        bounds["MAX_GROUP"],
        bounds["MAX_DIM"],
    )
    assert LANES == bounds["PANEL_LANES"]
